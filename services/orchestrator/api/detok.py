"""Incremental text of a committed prefix: deltas that never need retracting, cut at the first stop sequence.

Each round decodes only its new ids (tokenizers' DecodeStream keeps a few ids of context), so a round costs the
same at token 1000 as at token 10 and the server's handler can run it on the event loop."""

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tokenizers.decoders import DecodeStream


class Detokenizer(Protocol):
    def step(self, token_id: int) -> str:
        """Text that token_id completes: "" while a character still waits for its bytes."""

    def rest(self) -> str:
        """What the ids still waiting decode to once no more come (a character whose bytes never completed)."""


class StreamDecoder:
    """A fast (Rust) tokenizer's DecodeStream: O(1) per id."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer.backend_tokenizer
        self.stream = DecodeStream(skip_special_tokens=True)
        self.ids: list[int] = []
        self.length = 0  # characters returned

    def step(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.stream.step(self.tokenizer, token_id) or ""
        self.length += len(text)
        return text

    def rest(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)[self.length :]  # once per request


class Redecoder:
    """Any decode function: re-decodes the whole prefix per id (tokenizers without a Rust backend, tests)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode, self.ids, self.text = decode, [], ""

    def step(self, token_id: int) -> str:
        self.ids.append(token_id)
        full = self.decode(self.ids).rstrip("\ufffd")  # an incomplete UTF-8 character may still complete
        delta = full[len(self.text) :] if len(full) > len(self.text) else ""
        self.text += delta
        return delta

    def rest(self) -> str:
        return self.decode(self.ids)[len(self.text) :]


def detokenizer(tokenizer) -> Detokenizer:
    """The incremental decoder of a Hugging Face tokenizer, decoding as `tokenizer.decode(ids,
    skip_special_tokens=True)` does."""
    if getattr(tokenizer, "backend_tokenizer", None) is not None:
        return StreamDecoder(tokenizer)
    return Redecoder(lambda ids: tokenizer.decode(ids, skip_special_tokens=True))


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
    decoder: Detokenizer
    stop: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # committed prefix
    decoded: str = ""  # text of the complete characters of the prefix
    ends: list[int] = field(default_factory=list)  # len(decoded) after each id of the prefix
    text: str = ""  # emitted so far
    sent_ids: int = 0
    stopped: bool = False
    final: bool = False  # flushed: the prefix is complete, and the decoder's rest is in decoded

    def push(self, ids: list[int]) -> tuple[str, list[int]]:
        """Extend the prefix by ids -> (text delta, token ids delta) to send now."""
        if self.stopped:
            return "", []
        self.ids += ids
        for token_id in ids:
            self.decoded += self.decoder.step(token_id)
            self.ends.append(len(self.decoded))
        longest = max((len(s) for s in self.stop), default=0)
        hit = find_stop(self.decoded, self.stop, max(0, len(self.text) - longest + 1)) if self.stop else None
        if hit is not None:
            self.stopped = True
            return self.emit(hit, self.stop_token(hit))
        return self.emit(len(self.decoded) - held_back(self.decoded[len(self.text) :], self.stop), len(self.ids))

    def flush(self) -> tuple[str, list[int]]:
        """Everything still held back, once the prefix is final; nothing more after the first call."""
        if self.stopped or self.final:
            return "", []
        self.final = True
        self.decoded += self.decoder.rest()
        return self.emit(len(self.decoded), len(self.ids))

    def stop_token(self, hit: int) -> int:
        """Number of ids up to the token that completed the stop sequence (those stay in token_ids, as in vLLM)."""
        complete = hit + min(len(s) for s in self.stop if self.decoded.startswith(s, hit))
        return bisect_left(self.ends, complete, lo=self.sent_ids) + 1

    def emit(self, end: int, n_ids: int) -> tuple[str, list[int]]:
        """Send decoded[:end] and ids[:n_ids], less what was sent."""
        delta = self.decoded[len(self.text) : end]
        self.text += delta
        ids = self.ids[self.sent_ids : n_ids]
        self.sent_ids = max(self.sent_ids, n_ids)
        return delta, ids
