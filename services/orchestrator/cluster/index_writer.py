"""The cache index kept current from one asyncio task, so that no step waits on Redis; and the orchestrator's lease.

The admission decides from its own copy and queues each change as a write; the writer applies them in order, every write
queued when it goes in one batch (one round trip, however many requests committed that round), and renews the
orchestrator's lease every third of its length, busy or idle: while it lives, no other orchestrator adopts this one's
requests (admission.py), so a lease only lapses when the orchestrator is gone or cut off from Redis. When the index
cannot be reached it is down: the writer keeps no writes, only which requests changed, pings with backoff until the
index answers, then writes every live request whole again (Redis may have restarted empty) and releases the requests
that ended meanwhile. A commit refused because the entry is gone (a restart between two writes) does the same.
"""

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

from services.serving.cache_index import CacheIndex, IndexUnavailable, Op

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Write:
    """A change to one request's record: the index's operations, run in order, and what to do once all landed."""

    request_id: str
    ops: list[Op]
    landed: Callable[[], None] | None = None


Restore = Callable[[set[str]], list[Write]]  # changed request ids -> writes that restore the index

RETRY_S = (0.05, 1.0)  # first and longest wait between pings while the index is down


class IndexWriter:
    """Runs on the serving event loop, as the admission that pushes writes does. restore: the writes that bring an
    index that lost anything back to the admission's copy; they precede every write queued after them."""

    def __init__(self, index: CacheIndex, restore: Restore, owner: str, lease_s: float):
        self.index, self.restore, self.owner, self.lease_s = index, restore, owner, lease_s
        self.queue: deque[Write] = deque()  # in order
        self.changed: set[str] = set()  # requests changed while down
        self.down: str | None = None  # why, while the index cannot be reached
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.renewed = float("-inf")  # time.monotonic() of the last lease renewal
        self.stopping = False
        self.address = ""  # where other orchestrators relay this one's streams from, recorded with its lease

    async def start(self) -> None:
        """Take the lease (IndexUnavailable when the index cannot be reached), then write from a task."""
        await self.renew()
        self.task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        """Write what is queued, then end; the lease lapses by itself. Not by a cancel: redis-py swallows one that
        comes while it waits for a reply."""
        self.stopping = True
        self.wake.set()
        if self.task is not None:
            await self.task

    def push(self, write: Write) -> None:
        if self.down is not None:
            self.changed.add(write.request_id)
            return
        self.queue.append(write)
        self.wake.set()

    async def renew(self) -> None:
        await self.index.lease(self.owner, self.lease_s, self.address)
        self.renewed = time.monotonic()

    def renewal_due(self) -> float:
        """Seconds until the lease is due for renewal."""
        return max(self.renewed + self.lease_s / 3 - time.monotonic(), 0.0)

    async def run(self) -> None:
        while not self.stopping:
            try:
                await self.flush()
                await self.idle()
            except IndexUnavailable as e:
                self.fail(e)
                await self.reconnect()

    async def flush(self) -> None:
        """Apply every queued write, those queued by then in one batch, renewing the lease whenever it is due;
        IndexUnavailable when the index cannot be reached (the batch's writes stay queued for `fail`)."""
        while True:
            if not self.renewal_due():
                await self.renew()
            if not self.queue:
                return
            batch = list(self.queue)
            results = iter(await self.index.batch([op for write in batch for op in write.ops]))
            for write in batch:
                errors = [r for r in islice(results, len(write.ops)) if isinstance(r, Exception)]
                if any(isinstance(e, KeyError) for e in errors):
                    self.recover()  # the index lost the entry: write everything again, this write on
                    break
                if errors:  # a bad write is dropped rather than retried forever
                    log.error("cache index write for %s failed", write.request_id, exc_info=errors[0])
                elif write.landed is not None:
                    write.landed()
                self.queue.popleft()

    async def idle(self) -> None:
        """Until a write is queued or the lease is due (its renewal tells new requests that the index is down)."""
        self.wake.clear()
        if self.queue or self.stopping:
            return
        try:  # not wait_for: on 3.11 it swallows a cancel that comes as the event is set
            async with asyncio.timeout(self.renewal_due()):
                await self.wake.wait()
        except TimeoutError:
            pass

    def fail(self, error: IndexUnavailable) -> None:
        if self.down is None:
            log.warning("%s", error)
        self.down = str(error)
        self.changed |= {write.request_id for write in self.queue}
        self.queue.clear()

    async def reconnect(self) -> None:
        wait = RETRY_S[0]
        while not self.stopping:
            await asyncio.sleep(wait)
            try:
                await self.renew()
            except IndexUnavailable as e:
                self.fail(e)
                wait = min(2 * wait, RETRY_S[1])
                continue
            log.warning("cache index (%s) is back: writing the live requests again", self.index)
            self.recover()
            return

    def recover(self) -> None:
        changed = self.changed | {write.request_id for write in self.queue}
        self.queue = deque(self.restore(changed))
        self.changed.clear()
        self.down = None
