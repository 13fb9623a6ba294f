"""Propose stage for plain AR decoding: the next token of any causal LM (drafter proposals come from drafters)."""

import torch

from services.ar_guider.guider import Guider
from services.common.proposal import Proposal, Region, propose_from_logits
from services.common.request import Request


class ARPropose:
    def __init__(self, model: Guider):
        self.model = model

    def __call__(self, req: Request, region: Region) -> Proposal:
        start = req.frontier
        logits = self.model.forward(req, start, torch.empty(0, dtype=torch.long))  # [1, V]
        return propose_from_logits(torch.tensor([start]), logits, req.sampling, req.generator, req.mask_id)

    def release(self, request_id: str) -> None:
        self.model.release(request_id)
