"""Deterministic verifiable prompt/response tasks with exact answers.

Six families (count, copy, reverse, sort, add, code). The split is a pure function of the prompt (a hash
bucket), so a held-out item can never equal a train item whatever the seeds; the seed only drives which
items are drawn.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

FAMILIES: tuple[str, ...] = ("count", "copy", "reverse", "sort", "add", "code")
SPLITS: tuple[str, ...] = ("train", "heldout")
HELDOUT_BUCKETS = 10  # 1 prompt in HELDOUT_BUCKETS belongs to the held-out split


@dataclass(slots=True, frozen=True)
class Task:
    family: str
    prompt: str
    response: str

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}")


def split_of(prompt: str) -> str:
    h = int.from_bytes(hashlib.sha1(prompt.encode()).digest()[:8], "big")
    return "heldout" if h % HELDOUT_BUCKETS == 0 else "train"


def _count(rng: random.Random) -> tuple[str, str]:
    start, step, n = rng.randint(0, 50), rng.randint(1, 5), rng.randint(10, 40)
    return f"count from {start} step {step} for {n}:", " ".join(str(start + i * step) for i in range(n))


def _letters(rng: random.Random) -> list[str]:
    return [rng.choice(string.ascii_lowercase) for _ in range(rng.randint(8, 24))]


def _copy(rng: random.Random) -> tuple[str, str]:
    xs = _letters(rng)
    return "copy: " + " ".join(xs), " ".join(xs)


def _reverse(rng: random.Random) -> tuple[str, str]:
    xs = _letters(rng)
    return "reverse: " + " ".join(xs), " ".join(reversed(xs))


def _sort(rng: random.Random) -> tuple[str, str]:
    xs = [rng.randint(0, 99) for _ in range(rng.randint(5, 8))]
    return "sort: " + " ".join(map(str, xs)), " ".join(map(str, sorted(xs)))


def _add(rng: random.Random) -> tuple[str, str]:
    # zero-padded fixed-width operands and sum: digit columns line up, which tiny models need
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    return f"add {a:03d}+{b:03d}=", f"{a + b:04d}"


# (source template, argument generator); the response is repr() of actually running the call
_CODE: tuple[tuple[str, Callable[[random.Random], dict[str, object]]], ...] = (
    (
        "def f(x): return x * {a} + {b}\nf({c})",
        lambda r: dict(a=r.randint(2, 9), b=r.randint(0, 9), c=r.randint(0, 20)),
    ),
    ("def f(x): return x % {a}\nf({c})", lambda r: dict(a=r.randint(2, 9), c=r.randint(10, 99))),
    ("def f(x): return x // {a}\nf({c})", lambda r: dict(a=r.randint(2, 9), c=r.randint(10, 99))),
    ("def f(s): return s[::-1]\nf({s!r})", lambda r: dict(s="".join(r.choices("abcdefgh", k=r.randint(3, 6))))),
    ("def f(s): return s.upper()\nf({s!r})", lambda r: dict(s="".join(r.choices("abcdefgh", k=r.randint(3, 6))))),
    ("def f(xs): return sum(xs)\nf({xs})", lambda r: dict(xs=[r.randint(0, 9) for _ in range(r.randint(2, 5))])),
    ("def f(xs): return max(xs)\nf({xs})", lambda r: dict(xs=[r.randint(0, 99) for _ in range(r.randint(2, 5))])),
    ("def f(xs): return len(xs)\nf({xs})", lambda r: dict(xs=[r.randint(0, 9) for _ in range(r.randint(1, 7))])),
    ("def f(xs): return sorted(xs)\nf({xs})", lambda r: dict(xs=[r.randint(0, 9) for _ in range(r.randint(2, 5))])),
    (
        "def f(x):\n    if x > {a}:\n        return x - {a}\n    return x + {b}\nf({c})",
        lambda r: dict(a=r.randint(1, 20), b=r.randint(1, 9), c=r.randint(0, 30)),
    ),
    (
        "def f(n):\n    t = 0\n    for i in range(n):\n        t += i\n    return t\nf({c})",
        lambda r: dict(c=r.randint(1, 12)),
    ),
)


def _code(rng: random.Random) -> tuple[str, str]:
    template, args = rng.choice(_CODE)
    src = template.format(**args(rng))
    return src + "\n#", run_code(src)


def run_code(src: str) -> str:
    """repr() of the last line (a call) evaluated after exec-ing the definition lines above it."""
    *defs, call = src.split("\n")
    env: dict[str, object] = {}
    exec("\n".join(defs), env)  # our own templated source
    return repr(eval(call, env))


_GEN: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "count": _count,
    "copy": _copy,
    "reverse": _reverse,
    "sort": _sort,
    "add": _add,
    "code": _code,
}


def generate(family: str, n: int, split: str, seed: int) -> list[Task]:
    """n distinct tasks of one family and split; same (family, n, split, seed) -> same list."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}")
    rng = random.Random(f"{seed}/{family}/{split}")
    seen: set[str] = set()
    out: list[Task] = []
    for _ in range(200 * n + 1000):
        if len(out) == n:
            break
        prompt, response = _GEN[family](rng)
        if prompt in seen or split_of(prompt) != split:
            continue
        seen.add(prompt)
        out.append(Task(family, prompt, response))
    if len(out) < n:
        raise ValueError(f"{family}/{split}: only {len(out)} distinct items, asked for {n}")
    return out


def check(task: Task, output_text: str) -> bool:
    """Exact answer: the output (up to eos / surrounding whitespace) equals the response."""
    return output_text.split("<|endoftext|>", 1)[0].strip() == task.response
