"""Build the on-disk dataset (`dlm data`) and turn it into token examples and length-bucketed batches.

Layout of data/: tasks_{train,heldout}.jsonl ({family, prompt, response}), corpus_{train,heldout}.jsonl
({module, text} chunks), meta.json (seed, counts, sys.version).
Sequence format: prompt + <|response|> + response + <|endoftext|>; corpus items are plain text + eos.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from services.training import corpus, tasks
from services.training.specials import EOS, RESPONSE


@dataclass(slots=True)
class DataConfig:
    out: str = "data"
    seed: int = 0
    n_train: int = 20_000  # per family (count has ~7k distinct train items, it is capped there)
    n_heldout: int = 200  # per family
    chunk_chars: int = 360
    max_modules: int = 0  # 0 = whole stdlib; >0 caps it (tests)

    def __post_init__(self) -> None:
        if self.n_train <= 0 or self.n_heldout <= 0 or self.chunk_chars < 64 or self.max_modules < 0:
            raise ValueError("n_train, n_heldout must be > 0 and chunk_chars >= 64")


N_TRAIN_CAP = {"count": 6000}


def build(cfg: DataConfig) -> dict[str, object]:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, object] = {"config": asdict(cfg), "python": corpus.version(), "counts": {}}
    for split, n in (("train", cfg.n_train), ("heldout", cfg.n_heldout)):
        rows = [
            asdict(t) for f in tasks.FAMILIES for t in tasks.generate(f, min(n, N_TRAIN_CAP.get(f, n)), split, cfg.seed)
        ]
        _write(out / f"tasks_{split}.jsonl", rows)
        mods = corpus.load(split)[: cfg.max_modules or None]
        docs = [{"module": d.module, "text": c} for d in mods for c in corpus.chunks(d.text, cfg.chunk_chars)]
        _write(out / f"corpus_{split}.jsonl", docs)
        meta["counts"][f"tasks_{split}"] = len(rows)  # type: ignore[index]
        meta["counts"][f"corpus_{split}"] = len(docs)  # type: ignore[index]
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _read(path: Path) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for line in f]


def load_tasks(data: str | Path, split: str) -> list[tasks.Task]:
    return [tasks.Task(**r) for r in _read(Path(data) / f"tasks_{split}.jsonl")]


def load_corpus(data: str | Path, split: str) -> list[str]:
    return [r["text"] for r in _read(Path(data) / f"corpus_{split}.jsonl")]


@dataclass(slots=True)
class Example:
    ids: list[int]
    n_prompt: int  # tokens before the response, <|response|> included; 0 for plain LM text
    family: str


def encode_tasks(tok, items: list[tasks.Task], max_len: int) -> list[Example]:
    p = tok([t.prompt + RESPONSE for t in items], add_special_tokens=False)["input_ids"]
    r = tok([t.response + EOS for t in items], add_special_tokens=False)["input_ids"]
    return [Example(a + b, len(a), t.family) for a, b, t in zip(p, r, items, strict=True) if len(a) + len(b) <= max_len]


def encode_corpus(tok, texts: list[str], max_len: int) -> list[Example]:
    ids = tok([t + EOS for t in texts], add_special_tokens=False)["input_ids"]
    return [Example(x[:max_len], 0, "text") for x in ids if len(x) >= 8]


class Sampler:
    """Length buckets; batch for step s is a pure function of (seed, s), so resuming is exact."""

    def __init__(self, examples: list[Example], batch_tokens: int, seed: int, bucket: int = 16) -> None:
        self.buckets: list[list[Example]] = []
        by: dict[int, list[Example]] = {}
        for e in examples:
            by.setdefault((len(e.ids) - 1) // bucket, []).append(e)
        self.buckets = [by[k] for k in sorted(by)]
        self.caps = [max(1, batch_tokens // len(max(b, key=lambda e: len(e.ids)).ids)) for b in self.buckets]
        self.weights = [len(b) for b in self.buckets]
        self.seed = seed

    def batch(self, step: int) -> list[Example]:
        rng = random.Random(f"{self.seed}/{step}")
        i = rng.choices(range(len(self.buckets)), weights=self.weights)[0]
        return rng.choices(self.buckets[i], k=self.caps[i])


def fixed_batches(examples: list[Example], batch_tokens: int) -> list[list[Example]]:
    """Deterministic cover of a (held-out) set: sorted by length, cut by token budget."""
    out: list[list[Example]] = []
    cur: list[Example] = []
    for e in sorted(examples, key=lambda e: len(e.ids)):
        if cur and (len(cur) + 1) * len(e.ids) > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(e)
    if cur:
        out.append(cur)
    return out
