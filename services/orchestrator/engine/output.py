"""The one type the engine hands its frontends (the library, gRPC, the OpenAI API): what a step did for a request."""

import time
from dataclasses import dataclass, field

from services.common.proposal import Committed, TokenLogprob
from services.common.request import Request
from services.orchestrator.engine.round_timing import RoundTiming


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    ids: list[int]  # tokens that extended the committed contiguous prefix this round
    spans: list[tuple[int, list[int]]]  # (logical offset, ids) committed ahead of it
    finish_reason: str | None  # set on the request's last output
    elapsed_s: float  # since the request arrived
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per id, when the request asked
    error: BaseException | None = None  # it ended because of this
    timing: RoundTiming | None = None  # where the step that ran this round went (shared by its requests)

    @classmethod
    def of(cls, req: Request, committed: Committed, timing: RoundTiming | None = None) -> "RequestOutput":
        elapsed = time.perf_counter() - req.stats.start_s
        ids, spans, reason, logprobs = committed.ids, committed.spans, committed.finish_reason, committed.logprobs
        return cls(req.id, ids, spans, reason, elapsed, logprobs, timing=timing)

    @classmethod
    def ended(cls, req: Request, error: BaseException | None = None) -> "RequestOutput":
        """The last output of a request that ended without a round's commit (cancelled, deadline, an error)."""
        return cls(req.id, [], [], req.finish_reason, time.perf_counter() - req.stats.start_s, error=error)

    @property
    def finished(self) -> bool:
        return self.error is not None or self.finish_reason is not None
