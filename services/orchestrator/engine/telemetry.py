"""What the engine tells operators about each request: a span per request with a child per round (the stage spans
are children of the round, recorded where the stage ran: services/common/tracing.py), the metrics of a `Metrics`
sink (served: services/orchestrator/cluster/metrics.py), and one JSON log line when the request ends."""

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Protocol

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from services.common.config import EngineConfig
from services.common.proposal import Committed
from services.common.tracing import configure, traceparent
from services.orchestrator.engine.round_timing import RoundTiming
from services.orchestrator.engine.scheduler import EngineRequest

log = logging.getLogger("dlm.requests")


class Metrics(Protocol):
    """Where the counters, gauges and histograms go (Ray's Prometheus endpoint when served)."""

    def round(self, strategy: str, accepted: int, proposed: int) -> None: ...
    def finished(self, record: dict) -> None: ...
    def queue(self, engine: int, running: int, waiting: int) -> None: ...


class Telemetry:
    """One per engine. `replicas`: (request id, role) -> the replica that served it (served: RemoteExecutor.replica_of;
    in process: "local")."""

    def __init__(
        self,
        config: EngineConfig,
        metrics: Metrics | None = None,
        replicas: Callable[[str, str], str] | None = None,
        engine: int = 0,
    ):
        self.tracer = configure()
        self.metrics, self.replicas = metrics, replicas or (lambda request_id, role: "local")
        first = next(iter(config.models.values()), "")
        self.model = os.path.basename(os.path.normpath(first)) if first else ""
        self.engine = engine  # this engine's index among the backend's micro-batch engines
        self.requests: dict[str, Span] = {}
        self.rounds: dict[str, Span] = {}

    def added(self, er: EngineRequest) -> None:
        req = er.req
        self.requests[req.id] = self.tracer.start_span(
            "dlm.request",
            attributes={
                "gen_ai.operation.name": "text_completion",
                "gen_ai.request.model": self.model,
                "gen_ai.request.max_tokens": req.max_new_tokens,
                "gen_ai.usage.input_tokens": req.prompt_len,
                "dlm.request_id": req.id,
                "dlm.strategy": er.strategy,
            },
        )

    def round_begins(self, running: list[EngineRequest]) -> dict[str, str] | None:
        """Open a round span per running request; -> request id -> its round's traceparent, None untraced."""
        parents = {}
        for er in running:
            parent = self.requests.get(er.req.id)
            if parent is None or not parent.is_recording():
                continue
            span = self.tracer.start_span(
                "dlm.round",
                trace.set_span_in_context(parent),
                attributes={"dlm.round": er.req.stats.rounds + 1, "dlm.strategy": er.strategy},
            )
            self.rounds[er.req.id] = span
            parents[er.req.id] = traceparent(span)
        return parents or None

    def round_ends(
        self, er: EngineRequest, result: Committed | BaseException | None, timing: RoundTiming | None = None
    ) -> None:
        """result: the round's commits, why it failed, or None when it never finished (the request ended); timing:
        where its step went, as `dlm bench --breakdown` reads it."""
        stats = er.req.stats
        accepted = stats.accepted[-1] if isinstance(result, Committed) and stats.accepted else 0
        proposed = stats.proposed[-1] if isinstance(result, Committed) and stats.proposed else 0
        span = self.rounds.pop(er.req.id, None)
        if span is not None:
            span.set_attribute("dlm.tokens_accepted", accepted)
            span.set_attribute("dlm.tokens_proposed", proposed)
            if timing is not None:
                span.set_attributes(timing.attributes())
            if isinstance(result, BaseException):
                span.record_exception(result)
                span.set_status(Status(StatusCode.ERROR, str(result)))
            span.end()
        if self.metrics is not None and isinstance(result, Committed):
            self.metrics.round(er.strategy, accepted, proposed)

    def finished(self, er: EngineRequest, error: BaseException | None = None) -> dict:
        """The request ended (any reason): close its spans, count it, and log its JSON line; -> the record."""
        self.round_ends(er, None)
        req, stats = er.req, er.req.stats
        end = stats.end_s or time.perf_counter()
        latency = end - stats.start_s
        ttft = (stats.first_commit_s or end) - stats.start_s
        record = {
            "event": "request_finished",
            "request_id": req.id,
            "strategy": er.strategy,
            "prompt_tokens": req.prompt_len,
            "output_tokens": stats.tokens,
            "rounds": stats.rounds,
            "tpf": round(stats.tpf, 4),
            "p_cache": round(stats.p_cache, 4),
            "ttft_s": round(ttft, 6),
            "latency_s": round(latency, 6),
            "tpot_s": round((latency - ttft) / max(stats.tokens - 1, 1), 6),
            "finish_reason": req.finish_reason,
            "replicas": {role: self.replicas(req.id, role) for role in er.stages.roles},
        }
        span = self.requests.pop(req.id, None)
        if span is not None:
            span.set_attributes(
                {
                    "gen_ai.usage.output_tokens": stats.tokens,
                    "gen_ai.response.finish_reasons": [req.finish_reason or "error"],
                    "dlm.rounds": stats.rounds,
                    "dlm.tpf": stats.tpf,
                    "dlm.p_cache": stats.p_cache,
                    "dlm.ttft_s": ttft,
                }
            )
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, str(error)))
            span.end()
        if self.metrics is not None:
            self.metrics.finished(record)
        if log.isEnabledFor(logging.INFO):
            log.info(json.dumps(record))
        return record

    def queue(self, running: int, waiting: int) -> None:
        if self.metrics is not None:
            self.metrics.queue(self.engine, running, waiting)
