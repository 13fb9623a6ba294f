"""Waiting and running queues. A request waits until the KV ledger has room for it on one replica of every host that
keeps its KV (in process the placement, placement.py; served the cache index, services/orchestrator/cluster/
admission.py), then runs: each step advances every running request one round. Admission is FIFO, so a large request
is not starved by small ones behind it."""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from services.common.placement import Placement
from services.common.request import Request
from services.orchestrator.decode.strategies import Stages


class ResourceExhausted(Exception):
    """The request can never fit, or the queue is full: gRPC RESOURCE_EXHAUSTED, HTTP 429."""


class Unavailable(Exception):
    """The request cannot start or go on now (the cache index is down, or its replica was lost and none took over in
    time): gRPC UNAVAILABLE, HTTP 503; clients retry."""


@dataclass(eq=False)
class EngineRequest:
    """A request as the engine holds it: its decode state, its stages and why it stops early, if it does."""

    req: Request
    stages: Stages
    strategy: str
    params: dict = field(default_factory=dict)
    deadline: float | None = None  # time.monotonic() after which it ends with "deadline"
    stop_reason: str | None = None  # set by abort(): cancelled, stop, deadline

    @property
    def tokens(self) -> int:
        """KV tokens it may hold on each replica."""
        return self.req.prompt_len + self.req.max_new_tokens


class Admission(Protocol):
    """Admits requests against the KV ledger; served, it also records each decision in the cache index."""

    placement: Placement  # the ledger

    async def start(self, wake: Callable[[], None]) -> None: ...  # before the first step; wake: room came, step
    async def stop(self) -> None: ...  # after the last step
    def fits(self, er: EngineRequest) -> bool: ...  # could ever be admitted; Unavailable: not now
    def wait(self, er: EngineRequest) -> None: ...  # it joined the queue
    def admit(self, er: EngineRequest) -> bool: ...  # reserve its tokens if there is room now
    def refusal(self, er: EngineRequest) -> Exception | None: ...  # why a waiting one never will be (index down)
    def progress(self, er: EngineRequest) -> None: ...  # after each round: record what it committed
    def release(self, er: EngineRequest) -> None: ...


class LedgerAdmission:
    """The ledger alone: in process, and the base of the served admission."""

    def __init__(self, placement: Placement):
        self.placement = placement
        self.wake: Callable[[], None] = lambda: None

    async def start(self, wake: Callable[[], None]) -> None:
        self.wake = wake

    async def stop(self) -> None:
        pass

    def fits(self, er: EngineRequest) -> bool:
        return er.tokens <= self.placement.budget

    def wait(self, er: EngineRequest) -> None:
        pass

    def admit(self, er: EngineRequest) -> bool:
        return self.placement.place(er.req.id, er.tokens) is not None

    def refusal(self, er: EngineRequest) -> Exception | None:
        return None

    def progress(self, er: EngineRequest) -> None:
        pass

    def release(self, er: EngineRequest) -> None:
        self.placement.free(er.req.id)
        self.wake()  # its room is free: a request waiting for it may fit now


class Scheduler:
    def __init__(self, admission: Admission, max_running: int, max_waiting: int):
        self.admission, self.max_running, self.max_waiting = admission, max_running, max_waiting
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []

    def add(self, er: EngineRequest) -> None:
        if not self.admission.fits(er):
            raise ResourceExhausted(f"prompt + max_new_tokens = {er.tokens} KV tokens exceeds a replica's budget")
        if len(self.waiting) >= self.max_waiting:
            raise ResourceExhausted(f"{len(self.waiting)} requests are already waiting for KV budget")
        self.waiting.append(er)
        self.admission.wait(er)

    def schedule(self) -> list[EngineRequest]:
        """Admit from the head of the queue while there is room; -> the requests this step advances."""
        while self.waiting and len(self.running) < self.max_running and self.admission.admit(self.waiting[0]):
            self.running.append(self.waiting.popleft())
        return list(self.running)

    def refused(self) -> list[tuple[EngineRequest, Exception]]:
        """Waiting requests the ledger will never admit, and why."""
        return [(er, why) for er in self.waiting if (why := self.admission.refusal(er)) is not None]

    def finish(self, er: EngineRequest) -> None:
        if er in self.running:
            self.running.remove(er)
        elif er in self.waiting:
            self.waiting.remove(er)
        else:
            return
        self.admission.release(er)  # a waiting one may hold a reservation already (served)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)
