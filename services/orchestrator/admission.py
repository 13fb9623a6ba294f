"""Admission against each replica's KV budget, and the cache index kept current round by round.

A request reserves prompt + max_new_tokens KV tokens on the drafter and the guider replica before it decodes.
Without room it waits in a bounded queue (FIFO by wake-up) until a request releases; a full queue, or a request
that could never fit, is refused with ResourceExhausted. Every round appends the new commits (positions in commit
order with their tokens) to the request's index entry; the end of the request, however it ends, releases it all.
"""

import asyncio
from collections.abc import Iterator

from services.common.proposal import Committed
from services.common.request import Request
from services.serving.cache_index import CacheIndex, IndexEntry


class ResourceExhausted(Exception):
    pass


def local_admission(serving) -> "KVAdmission":
    """Admission for an orchestrator whose models run in its own process (`dlm serve --local`)."""
    from services.serving.indexes import make_index

    index = make_index(serving.redis_url, default_ttl_s=serving.request_ttl_s)
    replicas = {"drafter": "local-drafter", "guider": "local-guider"}
    return KVAdmission(index, replicas, serving.kv_budget_tokens, serving.max_queue, serving.request_ttl_s)


class KVAdmission:
    def __init__(self, index: CacheIndex, replicas: dict[str, str], budget: int, max_queue: int, ttl_s: float):
        self.index, self.replicas, self.budget = index, replicas, budget
        self.max_queue, self.ttl_s = max_queue, ttl_s
        self.waiting = 0
        self.freed: asyncio.Condition | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def admit(self, req: Request, strategy: str, params: dict, timeout_s: float | None) -> None:
        need = req.prompt_len + req.max_new_tokens
        if need > self.budget:
            raise ResourceExhausted(
                f"prompt + max_new_tokens = {need} KV tokens exceeds a replica's budget of {self.budget}"
            )
        if self.freed is None:
            self.freed, self.loop = asyncio.Condition(), asyncio.get_running_loop()
        async with self.freed:
            while not self.reserve(req.id, need):
                if self.waiting >= self.max_queue:
                    raise ResourceExhausted(f"KV budget in use and {self.waiting} requests already waiting")
                self.waiting += 1
                try:
                    await asyncio.wait_for(self.freed.wait(), timeout_s)
                except TimeoutError:
                    raise ResourceExhausted("no KV budget became free before the deadline") from None
                finally:
                    self.waiting -= 1
        entry = IndexEntry(req.id, self.replicas.get("drafter"), self.replicas.get("guider"), strategy=strategy)
        entry.params, entry.ttl_s = {k: str(v) for k, v in params.items()}, self.ttl_s
        self.index.put(entry)

    def reserve(self, request_id: str, tokens: int) -> bool:
        done = []
        for replica in dict.fromkeys(self.replicas.values()):
            if not self.index.reserve(replica, tokens, self.budget, request_id=request_id):
                for r in done:
                    self.index.free(r, tokens, request_id=request_id)
                return False
            done.append(replica)
        return True

    def track(self, req: Request, rounds: Iterator[Committed]) -> "Tracked":
        return Tracked(self, req, rounds)

    def release(self, request_id: str) -> None:
        """Any thread: drop the request's entry and KV tokens, wake the queue."""
        self.index.release(request_id)
        if self.loop is not None and not self.loop.is_closed():
            asyncio.run_coroutine_threadsafe(self.wake(), self.loop)

    async def wake(self) -> None:
        async with self.freed:
            self.freed.notify_all()


class Tracked:
    """The request's rounds, recording each round's commits in the index; closing releases, started or not."""

    def __init__(self, admission: KVAdmission, req: Request, rounds: Iterator[Committed]):
        self.admission, self.req, self.rounds = admission, req, rounds
        self.recorded = 0
        self.closed = False

    def __iter__(self) -> "Tracked":
        return self

    def __next__(self) -> Committed:
        try:
            event = next(self.rounds)
        except BaseException:
            self.close()
            raise
        new = self.req.order[self.recorded :]
        if new:
            self.admission.index.commit(self.req.id, new, self.req.tokens[new].tolist())
            self.recorded = len(self.req.order)
        return event

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.rounds.close()
            finally:
                self.admission.release(self.req.id)
