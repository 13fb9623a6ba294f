"""The one frontend that gRPC and the OpenAI routes share: open a request, read its outputs, abort it. An asyncio
task per engine drives its steps; handlers only queue requests and read their output queues, and no request has a
thread of its own. A driver sleeps while its engine has nothing to run and wakes on a new request, an abort, or room
for a request it holds waiting (a reservation, or KV freed by a request that ended on any engine). The same frontend
serves the in-process engine (`dlm serve --local`, tests) and the engine over Ray Serve deployments
(services/orchestrator/cluster/app.py)."""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from typing import Protocol
from uuid import uuid4

from services.common.request import Request
from services.common.sampling import SamplingParams
from services.orchestrator.api.detok import Detokenizer, detokenizer
from services.orchestrator.decode.strategies import STRATEGIES, make_params
from services.orchestrator.engine.engine import AlreadyExists, Engine, seconds_to_first
from services.orchestrator.engine.output import RequestOutput

log = logging.getLogger(__name__)

__all__ = ["Adopted", "AlreadyExists", "Detached", "Frontend", "Job", "ModelInfo", "Records", "RequestOutput", "Spec"]

UNCLAIMED_S = 60.0  # how long a request adopted by a sweep keeps its output, once ended, for its client to resume


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
class ModelInfo:
    models: dict[str, str]  # role -> path
    vocab_size: int
    max_context: int
    device: str
    dtype: str
    default_strategy: str
    default_max_new_tokens: int


@dataclass(slots=True)
class Adopted:
    """A request taken over from its record: its decode state as of its last recorded round, and how to go on."""

    req: Request
    strategy: str
    params: dict
    replicas: dict[str, str] = field(default_factory=dict)  # deployment -> the replica its record says holds its KV


class Records(Protocol):
    """The cache index's records of requests (services/orchestrator/cluster/admission.py). address: where this
    orchestrator's streams can be relayed from (its private gRPC address), recorded with its lease; set before start."""

    address: str

    async def adopt(self, request_id: str) -> Adopted:
        """KeyError: no record; OwnerAlive: its orchestrator lives; IndexUnavailable: the index is down."""


class Detached(Exception):
    """Another stream resumed the request this stream was reading: it goes on there."""


class Job:
    """One request's output queue: the driver puts each round's commits, and its end. `read`: a stream has read it
    (a job a sweep adopted has none until its client resumes); `detached`: another stream took the request over."""

    def __init__(self, frontend: "Frontend", engine: Engine, req: Request):
        self.frontend, self.engine, self.req = frontend, engine, req
        self.request_id, self.prompt_tokens = req.id, req.prompt_len
        self.queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.read = self.detached = False

    @property
    def seed(self) -> int:
        return self.req.sampling.seed

    @property
    def finish_reason(self) -> str | None:
        return self.req.finish_reason

    def cancel(self, reason: str = "cancelled") -> None:
        """End the request at its engine's next step; nothing (no step) once it ended or another stream took it."""
        if self.detached or self.req.finished:
            return
        self.engine.abort(self.request_id, reason)
        self.frontend.wake(self.engine)

    def stats(self) -> dict:
        return self.req.stats.to_dict()

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """Each round's output until the request ends; the last one carries its finish reason. Detached when another
        stream resumes the request."""
        self.read = True
        self.frontend.unclaimed.pop(self.request_id, None)
        while True:
            out = await self.queue.get()
            if out.error is not None:
                raise out.error
            if out.ids or out.spans or out.finish_reason is None:
                yield out
            if out.finish_reason is not None:
                return


class Frontend:
    """engines: one, or several over the same hosts (micro-batches, vLLM's virtual engines): each has its own
    scheduler and driver task, so while one's batch is in the drafter another's is in the guider."""

    def __init__(self, *engines: Engine, records: Records | None = None):
        self.engines = engines
        self.records = records
        self.engine = engines[0]  # the models, the tokenizer and the configuration they share
        self.jobs: dict[str, Job] = {}
        self.unclaimed: dict[str, tuple[float, Job]] = {}  # ended, never read: request id -> (time.monotonic(), job)
        self.ready = False
        self.wakes = {engine: asyncio.Event() for engine in engines}
        self.drivers: list[asyncio.Task] = []

    async def start(self) -> None:
        """Load every model, then start driving steps."""
        await self.engine.executor.start()
        for admission in dict.fromkeys(e.scheduler.admission for e in self.engines):
            await admission.start(self.wake_waiting)
        self.ready = True
        self.drivers = [asyncio.create_task(self.drive(engine)) for engine in self.engines]

    async def open(self, spec: Spec) -> Job:
        """Queue a request on the least busy engine; ValueError names a bad field, ResourceExhausted says the queue
        is full, Unavailable that the cache index is down."""
        engine = self.least_busy()
        req = engine.request(spec.prompt, spec.max_new_tokens, spec.sampling, spec.request_id or uuid4().hex)
        if req.id in self.jobs:
            raise AlreadyExists(f"request_id {req.id!r} is already decoding")
        engine.add(req, spec.strategy, spec.params, spec.deadline)
        job = self.jobs[req.id] = Job(self, engine, req)
        self.wake(engine)
        return job

    async def resume(self, spec: Spec) -> Job:
        """Go on with a request from where a client's stream broke: the job's first output is everything the request
        has streamed, so that the stream (api/deltas.py) can skip what the client has. A request live here (adopted
        by the sweep, or this is its owner) gets the new stream, and its previous stream ends (Detached); any other
        is adopted from its record in the cache index (its last recorded round). KeyError when there is no record to
        resume."""
        job = self.attach(spec.request_id) or await self.adopt(spec.request_id, spec.deadline)
        return self.attach(spec.request_id) if job.read else job  # another stream resumed it meanwhile

    async def adopt(self, request_id: str, deadline: float | None = None) -> Job:
        """Take a request over from its record (Records.adopt's errors), and decode it here; its job's first output
        is everything the record had streamed. A request live here already keeps its job."""
        if self.records is None:
            raise KeyError("this server keeps no records to resume from")
        adopted = await self.records.adopt(request_id)
        if request_id in self.jobs:  # adopted here (by a sweep, or a stream) while the index answered
            return self.jobs[request_id]
        req, engine = adopted.req, self.least_busy()
        engine.add(req, adopted.strategy, adopted.params, deadline)
        job = self.jobs[req.id] = Job(self, engine, req)
        job.queue.put_nowait(so_far(req))
        self.wake(engine)
        return job

    def least_busy(self) -> Engine:
        return min(self.engines, key=lambda e: len(e.requests))

    def attach(self, request_id: str) -> Job | None:
        """The request's job for a stream that resumes it, when it is live here or ended unread; None otherwise."""
        now = time.monotonic()
        self.unclaimed = {rid: (t, job) for rid, (t, job) in self.unclaimed.items() if now - t < UNCLAIMED_S}
        if request_id in self.unclaimed:
            return self.unclaimed.pop(request_id)[1]
        job = self.jobs.get(request_id)
        if job is None or not job.read:
            return job  # unread: its queue holds every output since its adoption
        job.detached = True
        detached = Detached(f"request {request_id!r} was resumed by another stream")
        job.queue.put_nowait(RequestOutput.ended(job.req, detached))
        fresh = self.jobs[request_id] = Job(self, job.engine, job.req)
        fresh.queue.put_nowait(so_far(job.req))
        return fresh

    def abort(self, request_id: str) -> bool:
        """End a live request as cancelled; False when it is not live."""
        job = self.jobs.get(request_id)
        if job is not None:
            job.cancel()
        return job is not None

    def wake(self, engine: Engine) -> None:
        self.wakes[engine].set()

    def wake_waiting(self) -> None:
        """Room came (a reservation, or a request's KV freed): the engines with requests waiting for it step."""
        for engine, wake in self.wakes.items():
            if engine.scheduler.waiting:
                wake.set()

    def emit(self, out: RequestOutput) -> None:
        job = self.jobs.get(out.request_id)
        if job is None:
            return
        job.queue.put_nowait(out)
        if out.finished:
            del self.jobs[out.request_id]
            if not job.read:  # a request the sweep adopted whose client has not resumed yet
                self.unclaimed[out.request_id] = (time.monotonic(), job)

    async def drive(self, engine: Engine) -> None:
        """The task that steps an engine while it has requests to run."""
        wake = self.wakes[engine]
        while True:
            wake.clear()  # a wake-up during the step below is kept for the wait after it
            try:
                await engine.step_async(self.emit)
            except Exception as e:  # a bug in the step itself: fail what runs rather than spin on it
                log.exception("engine step failed")
                for rid in list(engine.requests):
                    self.emit(engine.end(engine.requests[rid], "error", e))
                engine.flush_releases()
            if not engine.scheduler.running:  # nothing to advance until a request arrives, ends or expires
                expiry = seconds_to_first(er.deadline for er in engine.scheduler.waiting)  # ends with no wake-up
                try:  # not wait_for: on 3.11 it swallows a cancel that comes as the event is set
                    async with asyncio.timeout(expiry):
                        await wake.wait()
                except TimeoutError:
                    pass

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
        base = self.engine.executor.meta() if self.ready else None  # no loading behind start()'s back
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
        return [rid for engine in self.engines for rid in engine.requests]

    async def shutdown(self) -> None:
        """Every live request ends as cancelled at the next step; wait for the drivers to deliver that."""
        for engine in self.engines:
            for rid in list(engine.requests):
                engine.abort(rid)
            self.wake(engine)
        while self.jobs and self.drivers and not all(d.done() for d in self.drivers):
            await asyncio.sleep(0.01)
        for driver in self.drivers:
            driver.cancel()
        await asyncio.gather(*self.drivers, return_exceptions=True)
        for admission in dict.fromkeys(e.scheduler.admission for e in self.engines):
            await admission.stop()


def so_far(req: Request) -> RequestOutput:
    """An output of every token the request has streamed, as a resumed stream's first."""
    logprobs = [req.logprobs[p] for p in range(req.emitted)] if req.logprobs else []
    elapsed = time.perf_counter() - req.stats.start_s
    return RequestOutput(req.id, req.tokens[: req.emitted].tolist(), [], None, elapsed, logprobs)
