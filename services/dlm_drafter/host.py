"""The drafters of one replica behind batched methods: each takes every live request's arguments of a step and
returns one Reply each. The in-process engine calls a host directly; the Serve deployment is a host."""

import torch

from services.common.calls import Reply
from services.common.kv_manager import KVManager
from services.common.models import LoadedModel
from services.common.proposal import Proposal, Region
from services.common.request import Request
from services.dlm_drafter.bidirectional import BidirectionalCall, BidirectionalDrafter, Smoothing, Vicinity
from services.dlm_drafter.bidirectional import new_cache as new_block_cache
from services.dlm_drafter.causal import CausalDrafter


class DrafterHost:
    def __init__(self, causal: LoadedModel | None, bidirectional: LoadedModel | None, kv_budget_tokens: int):
        self.kv = KVManager(kv_budget_tokens)
        self.causal = CausalDrafter(causal, self.kv) if causal else None
        self.bidirectional = BidirectionalDrafter(bidirectional) if bidirectional else None

    def causal_drafter(self) -> CausalDrafter:
        if self.causal is None:
            raise ValueError("no causal drafter configured (models.drafter)")
        return self.causal

    def propose(self, calls: list[tuple[Request, Region, bool]]) -> list[Reply]:
        """(request, region, keep logits) -> Proposal: the causal drafter fills each region's masks, one forward."""
        out = self.causal_drafter().propose_batch([(req, region) for req, region, _ in calls])
        return [
            Reply(without_logits(proposal, keep), tokens, req.generator)
            for (req, _, keep), (proposal, tokens) in zip(calls, out, strict=True)
        ]

    def forward(
        self, calls: list[tuple[Request, torch.Tensor, torch.Tensor, torch.Tensor | None, bool]]
    ) -> list[Reply]:
        """(request, ids, positions, groups, stage KV) -> logits: slot verification and completion on the causal
        drafter; a staged forward's KV stays on this replica for the commits its round makes (000 §4.2)."""
        out = self.causal_drafter().forward_batch(calls)
        return [Reply(logits, tokens) for logits, tokens in out]

    def propose_bidirectional(
        self, calls: list[tuple[Request, Region, str, Vicinity, Smoothing | None, bool]]
    ) -> list[Reply]:
        """(request, region, cache mode, vicinity settings, smoothing, keep logits) -> Proposal on the bidirectional
        drafter."""
        if self.bidirectional is None:
            raise ValueError("no bidirectional drafter configured (models.drafter_bidirectional)")
        batch = [
            BidirectionalCall(req, region, self.kv.get(req, new_block_cache), cache, smoothing, vicinity)
            for req, region, cache, vicinity, smoothing, _ in calls
        ]
        out = self.bidirectional.propose_batch(batch)
        return [
            Reply(without_logits(proposal, call[5]), tokens, call[0].generator)
            for call, (proposal, tokens) in zip(calls, out, strict=True)
        ]

    def release(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.kv.free(rid)

    def held(self) -> dict[str, int]:
        return self.kv.held()


def without_logits(proposal: Proposal, keep: bool) -> Proposal:
    """The full distribution goes back only to gates that fuse it (credit decoding): it is most of a hop's bytes."""
    if not keep:
        proposal.logits = None
    return proposal
