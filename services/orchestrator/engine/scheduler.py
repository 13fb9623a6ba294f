"""Waiting and running queues. A request waits until the KV admission has room for it on its replicas, then runs:
each step advances every running request one round. Admission is FIFO, so a large request is not starved by small
ones behind it."""

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from services.common.request import Request
from services.orchestrator.decode.strategies import Stages


class ResourceExhausted(Exception):
    pass


class Unavailable(Exception):
    """The request cannot start or go on now (the cache index is down, or its replica was lost and none took over in
    time): gRPC UNAVAILABLE, HTTP 503; clients retry."""


@dataclass(eq=False)
class Sequence:
    """A request as the scheduler sees it: its decode state, its stages and why it stops early, if it does."""

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
    """The KV budget of the replicas a request decodes on (in-process: token counts; served: the cache index)."""

    async def start(self) -> None: ...  # on the serving event loop, before the first step
    def fits(self, seq: Sequence) -> bool: ...  # could ever be admitted; Unavailable: not now
    def admit(self, seq: Sequence) -> bool: ...  # reserve its tokens if there is room now
    def progress(self, seq: Sequence) -> None: ...  # after each round: record what it committed
    def release(self, seq: Sequence) -> None: ...


class TokenAdmission:
    """One replica per role in process: a plain count of reserved tokens against the budget."""

    def __init__(self, budget_tokens: int):
        self.budget, self.reserved = budget_tokens, {}

    async def start(self) -> None:
        pass

    def fits(self, seq: Sequence) -> bool:
        return seq.tokens <= self.budget

    def admit(self, seq: Sequence) -> bool:
        if sum(self.reserved.values()) + seq.tokens > self.budget:
            return False
        self.reserved[seq.req.id] = seq.tokens
        return True

    def progress(self, seq: Sequence) -> None:
        pass

    def release(self, seq: Sequence) -> None:
        self.reserved.pop(seq.req.id, None)


class Scheduler:
    def __init__(self, admission: Admission, max_running: int, max_waiting: int):
        self.admission, self.max_running, self.max_waiting = admission, max_running, max_waiting
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        if not self.admission.fits(seq):
            raise ResourceExhausted(f"prompt + max_new_tokens = {seq.tokens} KV tokens exceeds a replica's budget")
        if len(self.waiting) >= self.max_waiting:
            raise ResourceExhausted(f"{len(self.waiting)} requests are already waiting for KV budget")
        self.waiting.append(seq)

    def schedule(self) -> list[Sequence]:
        """Admit from the head of the queue while there is room; -> the requests this step advances."""
        while self.waiting and len(self.running) < self.max_running and self.admission.admit(self.waiting[0]):
            self.running.append(self.waiting.popleft())
        return list(self.running)

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
            self.admission.release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)
