"""An AR model of one replica (the guider, the AR baseline) behind batched methods, one Reply per request."""

import torch

from services.ar_guider.guider import Guider
from services.common.calls import Reply
from services.common.kv_manager import KVManager
from services.common.models import LoadedModel
from services.common.request import Request


class GuiderHost:
    def __init__(self, loaded: LoadedModel, kv_budget_tokens: int):
        self.kv = KVManager(kv_budget_tokens)
        self.guider = Guider(loaded, self.kv)

    def verify(self, calls: list[tuple[Request, int, torch.Tensor, int]]) -> list[Reply]:
        """(request, start, draft, top_k) -> Verdict, all in one forward."""
        return [Reply(verdict) for verdict in self.guider.verify_batch(calls)]

    def forward(self, calls: list[tuple[Request, int, torch.Tensor]]) -> list[Reply]:
        """(request, start, draft) -> logits [M + 1, V]; AR decoding asks with an empty draft."""
        return [Reply(logits) for logits in self.guider.forward_batch(calls)]

    def release(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.kv.free(rid)

    def held(self) -> dict[str, int]:
        return self.kv.held()
