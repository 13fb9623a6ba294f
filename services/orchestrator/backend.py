"""What the gRPC server decodes with: an engine whose steps one asyncio task drives. Handlers only queue requests
and read their output queues; no request has a thread of its own. The same backend serves the in-process engine
(`dlm serve --local`, tests) and the engine over Ray Serve deployments (services/orchestrator/app.py)."""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from uuid import uuid4

from services.common.request import Request
from services.common.sampling import SamplingParams
from services.orchestrator.engine import AlreadyExists, Engine, Output
from services.orchestrator.strategies import STRATEGIES, make_params

log = logging.getLogger(__name__)

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
                yield Event(out.event.ids, out.event.spans, time.perf_counter() - self.req.stats.start_s)
            if out.event.finish_reason is not None:
                return


class EngineBackend:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.jobs: dict[str, Job] = {}
        self.ready = False
        self.wake = asyncio.Event()
        self.driver: asyncio.Task | None = None

    async def start(self) -> None:
        """Load every model, then start driving steps."""
        await asyncio.get_running_loop().run_in_executor(None, self.engine.models.start)
        self.ready = True
        self.driver = asyncio.create_task(self.drive())

    async def open(self, spec: Spec) -> Job:
        """Queue a request; ValueError names a bad field, ResourceExhausted says the queue is full."""
        engine = self.engine
        req = engine.request(spec.prompt, spec.max_new_tokens, spec.sampling, spec.request_id or uuid4().hex)
        if req.id in self.jobs:
            raise AlreadyExists(f"request_id {req.id!r} is already decoding")
        engine.add(req, spec.strategy, spec.params, spec.deadline)
        job = self.jobs[req.id] = Job(engine, req)
        self.wake.set()
        return job

    def emit(self, out: Output) -> None:
        job = self.jobs.get(out.request_id)
        if job is None:
            return
        job.queue.put_nowait(out)
        if out.error is not None or out.event.finish_reason is not None:
            del self.jobs[out.request_id]

    async def drive(self) -> None:
        """The one task that steps the engine while it has requests."""
        while True:
            if not self.engine.has_unfinished():
                self.wake.clear()
                await self.wake.wait()
            try:
                await self.engine.step_async(self.emit)
            except Exception as e:  # a bug in the step itself: fail what runs rather than spin on it
                log.exception("engine step failed")
                for rid in list(self.engine.sequences):
                    self.emit(self.engine.end(self.engine.sequences[rid], "error", e))
                self.engine.flush_releases()

    def decode_text(self, ids: list[int]) -> str:
        return self.engine.decode_text(ids)

    def strategies(self) -> dict[str, dict]:
        """Each strategy's parameters as this server runs them: its defaults under the config's overrides."""
        out = {}
        for name in STRATEGIES:
            params = make_params(name, self.engine.config.strategies.get(name, {}))
            out[name] = {key: getattr(params, key) for key in params.__dataclass_fields__}
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
        return list(self.engine.sequences)

    async def shutdown(self) -> None:
        """Every live request ends as cancelled at the next step; wait for the driver to deliver that."""
        for rid in list(self.engine.sequences):
            self.engine.abort(rid)
        self.wake.set()
        while self.jobs and self.driver is not None and not self.driver.done():
            await asyncio.sleep(0.01)
        if self.driver is not None:
            self.driver.cancel()
