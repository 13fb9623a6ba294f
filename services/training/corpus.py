"""Open-ended "code" regime: Python source of the running interpreter's standard library.

Split by module name (hash bucket), so no module appears in both splits. The text depends on the
interpreter, so `sys.version` is recorded with it.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELDOUT_BUCKETS = 10


@dataclass(slots=True, frozen=True)
class Document:
    module: str
    text: str


def split_of(module: str) -> str:
    h = int.from_bytes(hashlib.sha1(module.encode()).digest()[:8], "big")
    return "heldout" if h % HELDOUT_BUCKETS == 0 else "train"


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def iter_modules(max_chars: int = 60_000) -> list[Document]:
    """Top-level-and-package .py files of the stdlib, sorted by module name (tests, idle, site-packages out)."""
    root = stdlib_dir()
    skip = ("site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "turtledemo", "ensurepip")
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in skip for part in rel.parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if 200 <= len(text) <= max_chars:
            docs.append(Document(".".join(rel.with_suffix("").parts), text))
    return docs


def load(split: str) -> list[Document]:
    return [d for d in iter_modules() if split_of(d.module) == split]


def chunks(text: str, max_chars: int) -> list[str]:
    """Cut text at line boundaries into pieces of at most ~max_chars (the LM mix uses short windows)."""
    out, cur = [], ""
    for line in text.splitlines(keepends=True):
        if cur and len(cur) + len(line) > max_chars:
            out.append(cur)
            cur = ""
        cur += line[:max_chars]
    if cur.strip():
        out.append(cur)
    return out


def version() -> str:
    return sys.version
