"""The drafters of one replica behind the contract's DrafterHost methods (services/common/contract.py): each takes
every live request's arguments of a step and returns one Reply each. The in-process executor calls a host directly;
the Serve deployment is a host."""

import torch

from services.common.contract import (
    DrafterForward,
    FillMasks,
    Guessed,
    Propose,
    ProposeAfter,
    ProposeBidirectional,
    Reply,
    ScoreDraft,
)
from services.common.kv_manager import KVHost, KVManager
from services.common.models import LoadedModel
from services.common.proposal import without_logits
from services.dlm_drafter.bidirectional import BidirectionalCall, BidirectionalDrafter
from services.dlm_drafter.bidirectional import new_cache as new_block_cache
from services.dlm_drafter.causal import CausalDrafter


class DrafterHost(KVHost):
    def __init__(self, causal: LoadedModel | None, bidirectional: LoadedModel | None):
        self.kv = KVManager()
        self.causal = CausalDrafter(causal, self.kv) if causal else None
        self.bidirectional = BidirectionalDrafter(bidirectional) if bidirectional else None

    def causal_drafter(self) -> CausalDrafter:
        if self.causal is None:
            raise ValueError("no causal drafter configured (models.drafter)")
        return self.causal

    def propose(self, calls: list[Propose]) -> list[Reply]:
        out = self.causal_drafter().propose_batch([(c.req, c.region, c.ar_head) for c in calls])
        return [
            Reply(without_logits(proposal, c.keep_logits), tokens, c.req.rng.draws)
            for c, (proposal, tokens) in zip(calls, out, strict=True)
        ]

    def propose_after(self, calls: list[ProposeAfter]) -> list[Reply]:
        batch = [(c.req, c.start, c.drafts, c.counts, c.ends, c.ar_head) for c in calls]
        out = self.causal_drafter().propose_after_batch(batch)
        return [Reply(Guessed([without_logits(p, False) for p in ps], draws), tokens) for ps, draws, tokens in out]

    def forward(self, calls: list[DrafterForward]) -> list[Reply]:
        out = self.causal_drafter().forward_batch([(c.req, c.ids, c.positions, c.groups) for c in calls])
        return [Reply(logits, tokens) for logits, tokens in out]

    def fill_masks(self, calls: list[FillMasks]) -> list[Reply]:
        out = self.causal_drafter().fill_masks_batch([(c.req, c.ids, c.positions, c.groups) for c in calls])
        return [
            Reply(without_logits(p, False), tokens, c.req.rng.draws) for c, (p, tokens) in zip(calls, out, strict=True)
        ]

    def score_draft(self, calls: list[ScoreDraft]) -> list[Reply]:
        """A staged forward's KV stays on this replica for the commits its round makes (000 §4.2)."""
        batch = [(c.req, c.draft, c.positions, c.groups, c.stage_kv) for c in calls]
        return [Reply(verdict, tokens) for verdict, tokens in self.causal_drafter().score_draft_batch(batch)]

    def propose_bidirectional(self, calls: list[ProposeBidirectional]) -> list[Reply]:
        if self.bidirectional is None:
            raise ValueError("no bidirectional drafter configured (models.drafter_bidirectional)")
        batch = [
            BidirectionalCall(c.req, c.region, self.kv.get(c.req, new_block_cache), c.cache, c.smoothing, c.vicinity)
            for c in calls
        ]
        out = self.bidirectional.propose_batch(batch)
        return [
            Reply(without_logits(proposal, c.keep_logits), tokens, c.req.rng.draws)
            for c, (proposal, tokens) in zip(calls, out, strict=True)
        ]

    def check_health(self) -> None:
        drafter = self.causal or self.bidirectional
        if drafter is None:
            raise RuntimeError("no drafter model loaded")
        torch.ones(1, device=drafter.decoder.device).add_(1)  # the device is usable
