"""An AR model of one replica (the guider, the AR baseline) behind the contract's ARHost methods
(services/common/contract.py), one Reply per request."""

import torch

from services.ar_guider.guider import Guider
from services.common.contract import Lookahead, NextToken, Reply, Verify
from services.common.kv_manager import KVHost, KVManager
from services.common.models import LoadedModel
from services.common.proposal import without_logits


class GuiderHost(KVHost):
    def __init__(self, loaded: LoadedModel):
        self.kv = KVManager()
        self.guider = Guider(loaded, self.kv)

    def verify(self, calls: list[Verify]) -> list[Reply]:
        verdicts = self.guider.verify_batch([(c.req, c.start, c.draft, c.top_k) for c in calls])
        return [Reply(verdict) for verdict in verdicts]

    def next_token(self, calls: list[NextToken]) -> list[Reply]:
        proposals = self.guider.next_token_batch([(c.req, c.start) for c in calls])
        return [Reply(without_logits(p, False), draws=c.req.rng.draws) for c, p in zip(calls, proposals, strict=True)]

    def lookahead(self, calls: list[Lookahead]) -> list[Reply]:
        ahead = self.guider.lookahead_batch([(c.req, c.start, c.k) for c in calls])
        return [Reply(ids, forwards=forwards) for ids, forwards in ahead]

    def check_health(self) -> None:
        torch.ones(1, device=self.guider.decoder.device).add_(1)  # the device is usable
