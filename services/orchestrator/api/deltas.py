"""A job's rounds as what a client is sent, whatever the transport (gRPC, the OpenAI HTTP API): text deltas cut at
the first stop string or stop token id, their token ids and logprobs, spans ahead of the prefix, a row per round."""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from services.common.proposal import TokenLogprob
from services.orchestrator.api.detok import Detokenizer, TextStream
from services.orchestrator.api.frontend import Job
from services.orchestrator.engine.round_timing import RoundTiming


@dataclass(slots=True)
class Delta:
    text: str
    ids: list[int]
    logprobs: list[TokenLogprob]  # one per id, when the request asked
    spans: list[tuple[int, list[int]]]  # (logical offset, ids) committed ahead of the prefix
    sent: int  # token ids sent so far, these included
    rounds: int
    last: bool = False  # nothing follows it: the request's last output, with the text held back until then


@dataclass(slots=True)
class RoundRow:
    round: int
    prefix_tokens: int
    span_tokens: int
    elapsed_s: float
    timing: RoundTiming | None = None  # where its step went (None: the request ended without a round)


@dataclass
class Deltas:
    job: Job
    detokenizer: Detokenizer
    stop: list[str] = field(default_factory=list)
    stop_token_ids: frozenset[int] = frozenset()
    rows: list[RoundRow] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the committed prefix
    token_stopped: bool = False
    # a resumed stream: the token ids and the characters the client already has, which it is not sent again
    held_ids: int = 0
    held_chars: int = 0

    def __post_init__(self):
        self.text = TextStream(self.detokenizer, self.stop)

    @property
    def stopped(self) -> bool:
        return self.text.stopped or self.token_stopped

    @property
    def finish_reason(self) -> str | None:
        return "stop" if self.stopped else self.job.finish_reason

    @property
    def sent(self) -> int:
        return self.text.sent_ids

    @property
    def chars(self) -> int:
        """Characters of text sent so far."""
        return len(self.text.text)

    async def __aiter__(self) -> AsyncIterator[Delta]:
        async for event in self.job.outputs():
            spans = sum(len(ids) for _, ids in event.spans)
            self.rows.append(RoundRow(len(self.rows) + 1, len(event.ids), spans, event.elapsed_s, event.timing))
            if self.stopped:
                continue  # drain until the backend has released the request
            ids = self.cut_at_stop_token(event.ids)
            self.logprobs += event.logprobs[: len(ids)]
            delta = self.push(ids, last=event.finish_reason is not None)
            if self.stopped:
                self.job.cancel("stop")
            else:
                delta.spans = event.spans
            if delta.text or delta.ids or delta.spans:
                yield delta
        delta = self.push([], last=True)
        if delta.text or delta.ids:
            yield delta

    def cut_at_stop_token(self, ids: list[int]) -> list[int]:
        hits = [i for i, t in enumerate(ids) if t in self.stop_token_ids]
        if not hits:
            return ids
        self.token_stopped = True
        return ids[: hits[0] + 1]

    def push(self, ids: list[int], last: bool = False) -> Delta:
        """ids extend the prefix; last: they end it, and the text held back goes with them."""
        before = self.text.sent_ids
        text, sent = self.text.push(ids)
        if last:
            rest, more = self.text.flush()
            text, sent = text + rest, sent + more
        return self.delta(text, sent, before, last)

    def delta(self, text: str, ids: list[int], before: int, last: bool) -> Delta:
        logprobs = self.logprobs[before : self.text.sent_ids]
        text = text[max(self.held_chars - (len(self.text.text) - len(text)), 0) :]
        skip = max(self.held_ids - before, 0)
        return Delta(text, ids[skip:], logprobs[skip:], [], self.text.sent_ids, len(self.rows), last)
