"""Reservations in the cache index, the one KV ledger of every orchestrator, made from one asyncio task so that no
step waits on Redis.

A request that joins an engine's queue joins this one too; the task reserves for the queue from its head, in FIFO
order, each request with one atomic `CacheIndex.place` and the queue's requests in one round trip (`CacheIndex.batch`:
at c=16 a step's newcomers, rather than a round trip each): prompt + max_new_tokens on one replica of each KV-holding
deployment, the live one with the most free budget as the index counts it (every orchestrator's requests), all or
nothing. Once placed, a request is handed to the admission, which the scheduler asks at its next step. When no replica
has room for one, what those behind it got goes back and they wait with it, until a request that ended here gave its
tokens back in the index, or after a short poll (a request that ended on another orchestrator), the head alone tried
until it is placed. When the index cannot be reached every waiting request is refused (Unavailable: clients retry), as
the writer (index_writer.py) refuses new requests until the index is back.
"""

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice

from services.common.placement import Placement
from services.orchestrator.engine.scheduler import EngineRequest, Unavailable
from services.serving.cache_index import CacheIndex, IndexUnavailable, Op

POLL_S = 0.05  # between tries while no replica has room (another orchestrator may free some)
BATCH = 64  # reservations sent in one round trip


@dataclass(eq=False, slots=True)
class Pending:
    er: EngineRequest
    holders: dict[str, str] = field(default_factory=dict)  # deployment -> the replica to go back to, when live
    withdrawn: bool = False


class Reserver:
    """placed(er, chosen): called on the event loop when a request holds its reservation (deployment -> replica);
    refused(er, error): when it never will (the index cannot be reached)."""

    def __init__(
        self,
        index: CacheIndex,
        placement: Placement,
        placed: Callable[[EngineRequest, dict], None],
        refused: Callable[[EngineRequest, Exception], None],
    ):
        self.index, self.placement, self.placed, self.refused = index, placement, placed, refused
        self.queue: deque[Pending] = deque()
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.stopping = False
        self.blocked = False  # the head got no room at the last try: try it alone

    def start(self) -> None:
        self.task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        self.stopping = True
        self.wake.set()
        if self.task is not None:
            await self.task

    def add(self, er: EngineRequest, holders: dict[str, str] | None = None) -> None:
        self.queue.append(Pending(er, dict(holders or {})))
        self.wake.set()

    def withdraw(self, er: EngineRequest) -> None:
        """It ended before it was placed; a reservation made meanwhile is released."""
        for pending in self.queue:
            if pending.er is er:
                pending.withdrawn = True

    def refuse(self, error: Exception) -> None:
        """Refuse every request still waiting for a reservation: the index is down, and they must not wait on it."""
        queue, self.queue = self.queue, deque()
        for pending in queue:
            if not pending.withdrawn:
                self.refused(pending.er, error)

    def room(self) -> None:
        """A request that ended here gave its tokens back in the index."""
        self.wake.set()

    def candidates(self, holders: dict[str, str]) -> list[list[str]]:
        """Per KV-holding deployment, the live replicas it may go to: the one that holds its KV when it is live."""
        groups = []
        for deployment in self.placement.deployments:
            live = self.placement.live(deployment)
            holder = holders.get(deployment)
            groups.append([holder] if holder in live else live)
        return groups

    async def run(self) -> None:
        while not self.stopping:
            self.wake.clear()
            if self.queue and await self.reserve():
                continue
            try:  # not wait_for: on 3.11 it swallows a cancel that comes as the event is set
                async with asyncio.timeout(POLL_S if self.queue else None):
                    await self.wake.wait()
            except TimeoutError:
                pass

    async def reserve(self) -> bool:
        """Place the head of the queue and up to BATCH - 1 requests behind it in one round trip, each place atomic,
        in queue order; False when nothing moved (the head has no room or no live replica, or the index is down)."""
        before = len(self.queue)
        self.queue = deque(pending for pending in self.queue if not pending.withdrawn)
        withdrawn = len(self.queue) < before
        heads: list[tuple[Pending, list[list[str]]]] = []
        for pending in islice(self.queue, 1 if self.blocked else BATCH):
            groups = self.candidates(pending.holders)
            if not all(groups):
                break  # a deployment has no live replica (Serve is starting one)
            heads.append((pending, groups))
        if not heads:
            return withdrawn
        places = [Op("place", (p.er.req.id, g, p.er.tokens, self.placement.budget)) for p, g in heads]
        try:
            try:
                chosen = await self.index.batch(places)
            except IndexUnavailable:  # once more: a batch fails once on an index that restarted (a place is idempotent)
                chosen = await self.index.batch(places)
            if errors := [c for c in chosen if isinstance(c, Exception)]:
                raise errors[0]
            room = next((i for i, replicas in enumerate(chosen) if replicas is None), len(chosen))
            back = [
                pending.er.req.id
                for i, ((pending, _), replicas) in enumerate(zip(heads, chosen, strict=True))
                if replicas is not None and (i >= room or pending.withdrawn)  # withdrawn while the batch was out
            ]
            if back:  # a withdrawn request's reservation expires with the index's default TTL if this fails
                await self.index.batch([Op("release", (rid,)) for rid in back])
        except IndexUnavailable as e:
            self.refuse(Unavailable(str(e)))
            return False
        self.blocked = room == 0
        for (pending, _), replicas in zip(heads[:room], chosen[:room], strict=True):
            self.queue.remove(pending)
            if not pending.withdrawn:
                self.placed(pending.er, dict(zip(self.placement.deployments, replicas, strict=True)))
        return bool(room or withdrawn)
