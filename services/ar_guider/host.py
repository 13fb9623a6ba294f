"""An AR model of one replica (the guider, the AR baseline) behind the contract's ARHost methods
(services/common/contract.py), one Reply per request."""

import torch

from services.ar_guider.guider import Guider
from services.common.contract import ARForward, Lookahead, Reply, Verify
from services.common.kv_manager import KVHost, KVManager
from services.common.models import LoadedModel


class GuiderHost(KVHost):
    def __init__(self, loaded: LoadedModel):
        self.kv = KVManager()
        self.guider = Guider(loaded, self.kv)

    def verify(self, calls: list[Verify]) -> list[Reply]:
        verdicts = self.guider.verify_batch([(c.req, c.start, c.draft, c.top_k) for c in calls])
        return [Reply(verdict) for verdict in verdicts]

    def forward(self, calls: list[ARForward]) -> list[Reply]:
        return [Reply(logits) for logits in self.guider.forward_batch([(c.req, c.start, c.draft) for c in calls])]

    def lookahead(self, calls: list[Lookahead]) -> list[Reply]:
        ahead = self.guider.lookahead_batch([(c.req, c.start, c.k) for c in calls])
        return [Reply(ids, forwards=forwards) for ids, forwards in ahead]

    def check_health(self) -> None:
        torch.ones(1, device=self.guider.decoder.device).add_(1)  # the device is usable
