"""Per-replica KV: each request's cache object, in the spirit of nano-vllm's block manager. It never sees a model: the
model wrappers ask it for a request's cache and fill it. It keeps no budget of its own: the engine's scheduler admits
and places requests against each replica's KV budget (orchestrator/engine/placement.py), the one ledger, so a
replica refuses only when its device is really out of memory."""

from collections.abc import Callable
from typing import Any, TypeVar

from services.common.kv import cache_len
from services.common.request import Request

C = TypeVar("C")


class KVManager:
    def __init__(self):
        self.caches: dict[str, Any] = {}  # request id -> its cache (CausalCache, GuiderCache, BlockCache: has .kv)
        self.prefilled = 0  # KV tokens computed into an empty causal cache: prompts, and commits rebuilt after a move

    def get(self, req: Request, new: Callable[[], C]) -> C:
        """The request's cache, allocated on first use."""
        if req.id not in self.caches:
            self.caches[req.id] = new()
        return self.caches[req.id]

    def free(self, request_id: str) -> None:
        self.caches.pop(request_id, None)

    def held(self) -> dict[str, int]:
        """Request id -> KV tokens cached for it now."""
        return {rid: cache_len(cache.kv) for rid, cache in self.caches.items()}


class KVHost:
    """A model host whose requests' caches one KVManager holds: the contract's release and held for it."""

    kv: KVManager

    def release(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.kv.free(rid)

    def held(self) -> dict[str, int]:
        return self.kv.held()
