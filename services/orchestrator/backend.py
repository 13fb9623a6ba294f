"""What the gRPC server decodes with: the backend boundary and its in-process implementation over the Engine.

A backend validates a request, runs it, and hands its commits to the caller's event loop; a distributed backend
(Ray Serve handles) implements the same `Backend` protocol and the server does not change.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from threading import Event as Flag
from typing import Protocol
from uuid import uuid4

from services.common.proposal import Committed
from services.common.request import Request
from services.common.sampling import SamplingParams
from services.orchestrator.admission import KVAdmission
from services.orchestrator.engine import Engine
from services.orchestrator.strategies import STRATEGIES, make_params


@dataclass(slots=True)
class Spec:
    """A generation request in the backend's terms; the backend validates it in `open`."""

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


class Job(Protocol):
    request_id: str
    prompt_tokens: int
    finish_reason: str | None  # eos, length, cancelled, deadline; set once events are exhausted

    def events(self) -> AsyncIterator[Event]: ...
    def cancel(self, reason: str = "cancelled") -> None: ...
    def stats(self) -> dict: ...


class Backend(Protocol):
    ready: bool

    async def start(self) -> None: ...  # load every model
    async def open(self, spec: Spec) -> Job: ...  # ValueError names the bad field
    def decode_text(self, ids: list[int]) -> str: ...
    def strategies(self) -> dict[str, dict]: ...
    def model_info(self) -> ModelInfo: ...
    def live(self) -> list[str]: ...  # ids of requests holding state
    async def shutdown(self) -> None: ...


_END = object()


class AlreadyExists(Exception):
    pass


class LocalJob:
    """One request decoding on a worker thread; its commits cross to the event loop through a queue."""

    def __init__(self, req: Request, rounds: Iterator[Committed], deadline: float | None):
        self.req, self.rounds, self.deadline = req, rounds, deadline
        self.request_id, self.prompt_tokens = req.id, req.prompt_len
        self.stopping, self.stop_reason = Flag(), "cancelled"
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    @property
    def finish_reason(self) -> str | None:
        return self.req.finish_reason or (self.stop_reason if self.stopping.is_set() else None)

    def cancel(self, reason: str = "cancelled") -> None:
        if not self.stopping.is_set():
            self.stop_reason = reason
            self.stopping.set()

    def stats(self) -> dict:
        return self.req.stats.to_dict()

    def put(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone: nobody is listening
            pass

    def run(self) -> None:
        """Worker thread: decode round by round until finished, cancelled or past the deadline."""
        try:
            while not self.stopping.is_set():
                if self.deadline is not None and time.monotonic() > self.deadline:
                    self.cancel("deadline")
                    break
                event = next(self.rounds, None)
                if event is None:
                    break
                self.put(Event(event.ids, event.spans, time.perf_counter() - self.req.stats.start_s))
        except Exception as e:  # handed to the caller, who reports it
            self.put(e)
        finally:
            self.rounds.close()  # the loop's finally releases every stage's per-request state

    async def events(self) -> AsyncIterator[Event]:
        while (item := await self.queue.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            yield item


class LocalBackend:
    """The in-process Engine, each request decoded on a thread of a bounded pool."""

    def __init__(self, engine: Engine, max_concurrency: int = 16, admission: KVAdmission | None = None):
        self.engine = engine
        self.admission = admission  # KV budget and cache index; None: admit everything, index nothing
        self.pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="dlm-decode")
        self.jobs: dict[str, LocalJob] = {}
        self.ready = False

    def load(self) -> None:
        for role in self.engine.config.models:
            if role == "filter":
                self.engine.models.filter()
            else:
                self.engine.models.load(role)

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self.load)
        self.ready = True

    async def open(self, spec: Spec) -> LocalJob:
        if spec.request_id in self.jobs:
            raise AlreadyExists(f"request_id {spec.request_id!r} is already decoding")
        # tokenizer and stage set-up are quick; they stay on the event loop's thread, so never run concurrently
        req = self.engine.request(spec.prompt, spec.max_new_tokens, spec.sampling, spec.request_id or uuid4().hex)
        rounds = self.engine.stream(req, spec.strategy, spec.params)
        if self.admission is not None:
            timeout = spec.deadline - time.monotonic() if spec.deadline is not None else None
            await self.admission.admit(req, spec.strategy or self.engine.config.strategy, spec.params, timeout)
            rounds = self.admission.track(req, rounds)
        job = LocalJob(req, rounds, spec.deadline)
        self.jobs[req.id] = job
        self.pool.submit(self.run, job)
        return job

    def run(self, job: LocalJob) -> None:
        try:
            job.run()
        finally:
            self.jobs.pop(job.request_id, None)
            job.put(_END)

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
        return list(self.jobs)

    async def shutdown(self) -> None:
        for job in list(self.jobs.values()):
            job.cancel()
        await asyncio.get_running_loop().run_in_executor(None, self.pool.shutdown)
