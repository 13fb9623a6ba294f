"""Incremental text of a committed prefix: deltas that never need retracting, cut at the first stop sequence."""

from collections.abc import Callable
from dataclasses import dataclass, field


def held_back(text: str, stop: list[str]) -> int:
    """Length of the longest suffix of text that could still grow into a stop sequence."""
    longest = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


def find_stop(text: str, stop: list[str], start: int) -> int | None:
    """Index of the earliest stop sequence found at or after start."""
    hits = [i for s in stop if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


@dataclass
class TextStream:
    decode: Callable[[list[int]], str]
    stop: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # committed prefix
    text: str = ""  # emitted so far
    sent_ids: int = 0
    stopped: bool = False

    def push(self, ids: list[int]) -> tuple[str, list[int]]:
        """Extend the prefix by ids -> (text delta, token ids delta) to send now."""
        if self.stopped:
            return "", []
        self.ids += ids
        full = self.decode(self.ids)
        longest = max((len(s) for s in self.stop), default=0)
        hit = find_stop(full, self.stop, max(0, len(self.text) - longest + 1)) if self.stop else None
        if hit is not None:
            self.stopped = True
            return self.emit(full[:hit], self.stop_token(hit))
        end = len(full.rstrip("\ufffd"))  # an incomplete UTF-8 character may still complete
        end -= held_back(full[:end], self.stop)
        return self.emit(full[:end], len(self.ids))

    def flush(self) -> tuple[str, list[int]]:
        """Everything still held back, once the prefix is final."""
        return ("", []) if self.stopped else self.emit(self.decode(self.ids), len(self.ids))

    def stop_token(self, hit: int) -> int:
        """Number of ids up to the token that completed the stop sequence (those stay in token_ids, as in vLLM)."""
        for n in range(self.sent_ids + 1, len(self.ids) + 1):
            if find_stop(self.decode(self.ids[:n]), self.stop, hit) is not None:
                return n
        return len(self.ids)

    def emit(self, text: str, n_ids: int) -> tuple[str, list[int]]:
        delta = text[len(self.text) :] if len(text) > len(self.text) else ""
        self.text += delta
        ids = self.ids[self.sent_ids : n_ids]
        self.sent_ids = max(self.sent_ids, n_ids)
        return delta, ids
