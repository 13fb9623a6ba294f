"""Per-replica KV: each request's cache object and the replica's token budget, in the spirit of nano-vllm's block
manager. It never sees a model: the model wrappers ask it for a request's cache and fill it."""

from collections.abc import Callable
from typing import Any, TypeVar

from services.common.kv import cache_len
from services.common.request import Request

C = TypeVar("C")


class KVBudgetExceeded(RuntimeError):
    pass


class KVManager:
    def __init__(self, budget_tokens: int):
        self.budget = budget_tokens
        self.caches: dict[str, Any] = {}  # request id -> its cache (CausalCache, GuiderCache, BlockCache: has .kv)
        self.reserved: dict[str, int] = {}  # request id -> prompt + max_new_tokens, held while it lives

    @property
    def used(self) -> int:
        return sum(self.reserved.values())

    def get(self, req: Request, new: Callable[[], C]) -> C:
        """The request's cache, allocated with its whole reservation on first use."""
        if req.id not in self.caches:
            need = req.prompt_len + req.max_new_tokens
            if self.used + need > self.budget:
                raise KVBudgetExceeded(f"request {req.id} needs {need} KV tokens, {self.budget - self.used} are free")
            self.caches[req.id], self.reserved[req.id] = new(), need
        return self.caches[req.id]

    def free(self, request_id: str) -> None:
        self.caches.pop(request_id, None)
        self.reserved.pop(request_id, None)

    def held(self) -> dict[str, int]:
        """Request id -> KV tokens cached for it now."""
        return {rid: cache_len(cache.kv) for rid, cache in self.caches.items()}

    def usage(self) -> float:
        """Fraction of the budget reserved."""
        return self.used / self.budget
