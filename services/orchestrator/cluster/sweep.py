"""The sweep that leaves no request orphaned: every half lease, an orchestrator lists the records in the cache index
whose owner's lease has lapsed (its orchestrator died, or lost Redis for longer than a lease) and adopts each, so
that it goes on decoding here whether or not its client comes back. The index's adopt is one Lua script, so of two
sweepers only one wins a request (the other gets OwnerAlive). A client that resumes later finds its request live
here, or ended and kept for it (Frontend.attach), or on the orchestrator that won it.
"""

import asyncio
import logging

from services.orchestrator.api.frontend import Frontend
from services.serving.cache_index import CacheIndex, IndexUnavailable, OwnerAlive

log = logging.getLogger(__name__)


class Sweep:
    def __init__(self, frontend: Frontend, index: CacheIndex, lease_s: float):
        self.frontend, self.index, self.every_s = frontend, index, lease_s / 2
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            if not self.frontend.ready:  # models loading, or shutting down
                continue
            try:
                await self.once()
            except IndexUnavailable as e:  # the writer reports it; the next sweep tries again
                log.debug("sweep skipped: %s", e)

    async def once(self) -> list[str]:
        """Adopt every orphan another sweeper does not win first; returns the ids adopted here."""
        adopted = []
        for request_id in await self.index.orphans():
            try:
                await self.frontend.adopt(request_id)
            except (OwnerAlive, KeyError):  # another orchestrator won it, or it ended
                continue
            except Exception:  # one bad record must not stop the sweep of the others
                log.exception("sweep: adopting %s failed", request_id)
                continue
            log.warning("sweep: adopted %s, whose orchestrator's lease had lapsed", request_id)
            adopted.append(request_id)
        return adopted
