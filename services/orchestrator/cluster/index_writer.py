"""The cache index kept current from one asyncio task, so that no step waits on Redis.

The admission decides from its own copy and queues each change as a write; the writer applies them in order. When
the index cannot be reached it is down: the writer keeps no writes, only which requests changed, pings with backoff
until the index answers, then writes every live request whole again (Redis may have restarted empty) and releases
the requests that ended meanwhile. A commit refused because the entry is gone (a restart between two writes) does
the same.
"""

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable

from services.serving.cache_index import CacheIndex, IndexUnavailable

log = logging.getLogger(__name__)

Write = Callable[[CacheIndex], Awaitable[object]]
Restore = Callable[[set[str]], list[tuple[str, Write]]]  # changed request ids -> writes that restore the index

RETRY_S = (0.05, 1.0)  # first and longest wait between pings while the index is down
HEARTBEAT_S = 1.0  # ping when idle this long, so that new requests learn the index is down before they write


class IndexWriter:
    """restore: called under `lock` (the admission's, which also guards its copy), so that the writes it returns
    precede every write queued after it."""

    def __init__(self, index: CacheIndex, restore: Restore, lock: threading.Lock):
        self.index, self.restore, self.lock = index, restore, lock
        self.queue: deque[tuple[str, Write]] = deque()  # (request id, write), in order
        self.changed: set[str] = set()  # requests changed while down
        self.down: str | None = None  # why, while the index cannot be reached
        self.loop: asyncio.AbstractEventLoop | None = None
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        """On the event loop the writer runs on; pushes may come from any thread after this."""
        if self.task is None:
            self.loop = asyncio.get_running_loop()
            self.task = asyncio.create_task(self.run())

    def push(self, request_id: str, write: Write) -> None:
        """Queue a write (caller holds `lock`)."""
        if self.down is not None:
            self.changed.add(request_id)
            return
        self.queue.append((request_id, write))
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.wake.set)

    async def run(self) -> None:
        while True:
            try:
                await self.flush()
                await self.idle()
            except IndexUnavailable as e:
                self.fail(e)
                await self.reconnect()

    async def flush(self) -> None:
        """Apply every queued write; IndexUnavailable when the index cannot be reached."""
        while self.queue:
            request_id, write = self.queue[0]
            try:
                await write(self.index)
            except KeyError:
                self.recover()  # the index lost the entry: write everything again
                continue
            except IndexUnavailable:
                raise
            except Exception:  # a bad write is dropped rather than retried forever
                log.exception("cache index write for %s failed", request_id)
            self.queue.popleft()

    async def idle(self) -> None:
        self.wake.clear()
        if self.queue:
            return
        try:
            await asyncio.wait_for(self.wake.wait(), HEARTBEAT_S)
        except TimeoutError:
            await self.index.ping()

    def fail(self, error: IndexUnavailable) -> None:
        with self.lock:
            if self.down is None:
                log.warning("cache index (%s) unavailable: %s", self.index, error)
            self.down = f"cache index ({self.index}) unavailable: {error}"
            self.changed |= {rid for rid, _ in self.queue}
            self.queue.clear()

    async def reconnect(self) -> None:
        wait = RETRY_S[0]
        while True:
            await asyncio.sleep(wait)
            try:
                await self.index.ping()
            except IndexUnavailable as e:
                self.fail(e)
                wait = min(2 * wait, RETRY_S[1])
                continue
            log.warning("cache index (%s) is back: writing the live requests again", self.index)
            self.recover()
            return

    def recover(self) -> None:
        with self.lock:
            changed = self.changed | {rid for rid, _ in self.queue}
            self.queue = deque(self.restore(changed))
            self.changed.clear()
            self.down = None
