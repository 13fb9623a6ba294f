"""The README's examples: `console` blocks of `$ command` lines, each followed by what it prints, and `python` blocks
followed by a `text` block of what they print. Outputs match as doctest matches them (`...` stands for any text,
whitespace runs are equal). An example after `$ dlm serve` in the README targets that server, and one after
`$ dlm serve --local` the in-process one; the others decode in process."""

import doctest
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DLM = [sys.executable, "-m", "services.cli.cli"]  # `dlm` where the project is not installed
FENCE = re.compile(r"^( *)```(\w*)\s*$")
# where the README's served examples point, and the serving keys that move them (tests serve on free ports)
PORTS = {50051: "port", 8000: "http_port", 8080: "metrics_export_port", 8265: "dashboard_port"}


@dataclass(frozen=True)
class Block:
    lang: str
    body: str
    line: int  # of the opening fence, 1-based


@dataclass(frozen=True)
class Example:
    kind: str  # "console" or "python"
    source: str  # the command after `$ `, or the Python code
    expected: str
    line: int
    server: str | None  # None: in process; "ray": `dlm serve`; "local": `dlm serve --local`

    @property
    def starts_server(self) -> bool:
        return self.kind == "console" and self.source.startswith("dlm serve")

    def __str__(self) -> str:
        return f"README.md:{self.line}: {self.source.splitlines()[0]}"


def blocks(text: str) -> list[Block]:
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        body = textwrap.dedent("\n".join(lines[i + 1 : end]))
        out.append(Block(opening.group(2), body, i + 1))
        i = end + 1
    return out


def served(source: str) -> bool:
    return source.startswith("dlm serve") or any(re.search(rf"127\.0\.0\.1:{port}\b", source) for port in PORTS)


def examples(text: str | None = None) -> list[Example]:
    found, server = [], None
    parsed = blocks(README.read_text() if text is None else text)
    for n, block in enumerate(parsed):
        if block.lang == "console":
            for chunk in re.split(r"^\$ ", block.body, flags=re.M)[1:]:
                source, _, expected = chunk.partition("\n")
                if source.startswith("dlm serve"):
                    server = "local" if "--local" in source else "ray"
                line = block.line + 1 + block.body[: block.body.index(f"$ {source}")].count("\n")
                found.append(Example("console", source, expected, line, server if served(source) else None))
        elif block.lang == "python":
            after = parsed[n + 1] if n + 1 < len(parsed) else None
            expected = after.body + "\n" if after is not None and after.lang == "text" else ""
            found.append(Example("python", block.body, expected, block.line, server if served(block.body) else None))
    return found


def localize(text: str, ports: dict[int, int]) -> str:
    """The README's default ports replaced by the ones a test serves on."""
    for default, actual in ports.items():
        text = re.sub(rf"\b{default}\b", str(actual), text)
    return text


def matches(expected: str, got: str) -> bool:
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    return doctest.OutputChecker().check_output(expected, got, flags)


def make_run(source: str) -> list[str]:
    """`make run [PROMPT=...]` as the Makefile's recipe runs it once set up: `dlm generate "$(PROMPT)"`."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r'^run: setup\n\t@\$\(BIN\)/dlm generate "\$\(PROMPT\)"\n', makefile, re.M), "make run changed"
    words = shlex.split(source)[2:]
    given = dict(w.split("=", 1) for w in words)
    prompt = given.get("PROMPT", re.search(r"^PROMPT \?= (.*)$", makefile, re.M).group(1))
    return [*DLM, "generate", prompt]


def run(example: Example, cwd: Path, ports: dict[int, int], timeout: float = 600) -> str:
    """Run one example as a user would, in cwd, on the ports given; -> what a command shows in a terminal (its stdout,
    then its stderr), or what a Python example prints (its stdout: the library's own loading bars aside)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    source = localize(example.source, ports)
    if example.kind == "python":
        argv = [sys.executable, "-c", source]
    elif source.startswith("make run"):
        argv = make_run(source)
    elif source.startswith("dlm "):
        argv = [*DLM, *shlex.split(source)[1:]]
    else:
        argv = ["bash", "-c", source]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{example}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout if example.kind == "python" else done.stdout + done.stderr


def run_script(*args: str, timeout: float = 300) -> str:
    """`PYTHONPATH=. python scripts/NAME.py ARGS`, as the README cites a script, from the repository root -> its
    stdout; a non-zero exit fails the test with its stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout
