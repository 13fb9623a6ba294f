"""What the gRPC server decodes with: an engine whose steps one asyncio task drives. Handlers only queue requests
and read their output queues; no request has a thread of its own. The same backend serves the in-process engine
(`dlm serve --local`, tests) and the engine over Ray Serve deployments (services/orchestrator/cluster/app.py)."""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from uuid import uuid4

from services.common.proposal import TokenLogprob
from services.common.request import Request
from services.common.sampling import SamplingParams
from services.orchestrator.api.detok import Detokenizer, detokenizer
from services.orchestrator.decode.strategies import STRATEGIES, make_params
from services.orchestrator.engine.engine import AlreadyExists, Engine, Output

log = logging.getLogger(__name__)

ADMISSION_POLL_S = 0.01

__all__ = ["AlreadyExists", "EngineBackend", "Event", "Job", "ModelInfo", "Spec"]


@dataclass(slots=True)
class Spec:
    """A generation request in the backend's terms; the engine validates it in `open`."""

    prompt: str | list[int]
    max_new_tokens: int | None = None
    strategy: str | None = None  # None: the configured default
    params: dict = field(default_factory=dict)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""  # empty: the backend names it
    deadline: float | None = None  # time.monotonic() after which decoding stops


@dataclass(slots=True)
class Event:
    ids: list[int]  # extension of the contiguous prefix
    spans: list[tuple[int, list[int]]]  # (logical offset, ids) committed ahead of it
    elapsed_s: float
    logprobs: list[TokenLogprob]  # one per id, when the request asked


@dataclass(slots=True)
class ModelInfo:
    models: dict[str, str]  # role -> path
    vocab_size: int
    max_context: int
    device: str
    dtype: str
    default_strategy: str
    default_max_new_tokens: int


class Job:
    """One request's output queue: the driver puts each round's commits, and its end."""

    def __init__(self, engine: Engine, req: Request):
        self.engine, self.req = engine, req
        self.request_id, self.prompt_tokens = req.id, req.prompt_len
        self.queue: asyncio.Queue[Output] = asyncio.Queue()

    @property
    def seed(self) -> int:
        return self.req.sampling.seed

    @property
    def finish_reason(self) -> str | None:
        return self.req.finish_reason

    def cancel(self, reason: str = "cancelled") -> None:
        self.engine.abort(self.request_id, reason)

    def stats(self) -> dict:
        return self.req.stats.to_dict()

    async def events(self) -> AsyncIterator[Event]:
        while True:
            out = await self.queue.get()
            if out.error is not None:
                raise out.error
            if out.event.ids or out.event.spans or out.event.finish_reason is None:
                elapsed = time.perf_counter() - self.req.stats.start_s
                yield Event(out.event.ids, out.event.spans, elapsed, out.event.logprobs)
            if out.event.finish_reason is not None:
                return


class EngineBackend:
    """engines: one, or several over the same hosts (micro-batches, vLLM's virtual engines): each has its own
    scheduler and driver task, so while one's batch is in the drafter another's is in the guider."""

    def __init__(self, *engines: Engine):
        self.engines = engines
        self.engine = engines[0]  # the models, the tokenizer and the configuration they share
        self.jobs: dict[str, Job] = {}
        self.ready = False
        self.wakes = [asyncio.Event() for _ in engines]
        self.drivers: list[asyncio.Task] = []

    async def start(self) -> None:
        """Load every model, then start driving steps."""
        await self.engine.models.start()
        for admission in dict.fromkeys(e.scheduler.admission for e in self.engines):
            await admission.start()
        self.ready = True
        self.drivers = [asyncio.create_task(self.drive(e, w)) for e, w in zip(self.engines, self.wakes, strict=True)]

    async def open(self, spec: Spec) -> Job:
        """Queue a request on the least busy engine; ValueError names a bad field, ResourceExhausted says the queue
        is full, Unavailable that the cache index is down."""
        i = min(range(len(self.engines)), key=lambda i: len(self.engines[i].sequences))
        engine = self.engines[i]
        req = engine.request(spec.prompt, spec.max_new_tokens, spec.sampling, spec.request_id or uuid4().hex)
        if req.id in self.jobs:
            raise AlreadyExists(f"request_id {req.id!r} is already decoding")
        engine.add(req, spec.strategy, spec.params, spec.deadline)
        job = self.jobs[req.id] = Job(engine, req)
        self.wakes[i].set()
        return job

    def abort(self, request_id: str) -> bool:
        """End a live request as cancelled; False when it is not live."""
        job = self.jobs.get(request_id)
        if job is not None:
            job.cancel()
        return job is not None

    def emit(self, out: Output) -> None:
        job = self.jobs.get(out.request_id)
        if job is None:
            return
        job.queue.put_nowait(out)
        if out.error is not None or out.event.finish_reason is not None:
            del self.jobs[out.request_id]

    async def drive(self, engine: Engine, wake: asyncio.Event) -> None:
        """The task that steps an engine while it has requests."""
        while True:
            if not engine.has_unfinished():
                wake.clear()
                await wake.wait()
            try:
                await engine.step_async(self.emit)
            except Exception as e:  # a bug in the step itself: fail what runs rather than spin on it
                log.exception("engine step failed")
                for rid in list(engine.sequences):
                    self.emit(engine.end(engine.sequences[rid], "error", e))
                engine.flush_releases()
            if not engine.scheduler.running:  # every request waits for KV room: a step would not yield the loop
                await asyncio.sleep(ADMISSION_POLL_S)

    def detokenizer(self) -> Detokenizer:
        """A new request's incremental decoder."""
        return detokenizer(self.engine.tokenizer)

    def strategies(self) -> dict[str, dict]:
        """Each strategy's parameters as this server runs them: its defaults under the config's overrides."""
        out = {}
        for name in STRATEGIES:
            params = make_params(name, self.engine.config.strategies.get(name, {}))
            out[name] = {f.name: getattr(params, f.name) for f in fields(params)}
        return out

    def model_info(self) -> ModelInfo:
        config = self.engine.config
        base = self.engine.models.meta() if self.ready else None  # no loading behind start()'s back
        return ModelInfo(
            dict(config.models),
            len(base.tokenizer) if base else 0,
            base.max_length if base else 0,
            config.device,
            config.dtype,
            config.strategy,
            config.max_new_tokens,
        )

    def live(self) -> list[str]:
        return [rid for engine in self.engines for rid in engine.sequences]

    async def shutdown(self) -> None:
        """Every live request ends as cancelled at the next step; wait for the drivers to deliver that."""
        for engine, wake in zip(self.engines, self.wakes, strict=True):
            for rid in list(engine.sequences):
                engine.abort(rid)
            wake.set()
        while self.jobs and self.drivers and not all(d.done() for d in self.drivers):
            await asyncio.sleep(0.01)
        for driver in self.drivers:
            driver.cancel()
