"""Propose stage: a model fills the region's masked positions. Each proposer is a generator stage: it yields the call
it needs and gets the Proposal back from the step's batched call (services/common/contract.py)."""

from dataclasses import dataclass

from services.common.contract import Call, NextToken, Propose, ProposeBidirectional, Role, Smoothing, Stage, Vicinity
from services.common.proposal import Proposal, Region
from services.common.request import Request

FRONTIER_HEADS = ("ar", "mask")  # the causal drafter's two left-to-right decodes: a clean token's output, a mask's


@dataclass(frozen=True, slots=True)
class CausalPropose:
    keep_logits: bool = False  # the full distribution comes back only for gates that fuse it (credit)
    ar_head: bool = False  # the frontier's draft from the drafter's next-token head (FRONTIER_HEADS)

    def __call__(self, req: Request, region: Region) -> Stage[Proposal]:
        (proposal,) = yield [Call(Role.DRAFTER, Propose(req, region, self.keep_logits, self.ar_head))]
        return proposal


@dataclass(frozen=True, slots=True)
class BidirectionalPropose:
    cache: str
    smoothing: Smoothing | None = None
    keep_logits: bool = False
    vicinity: Vicinity = Vicinity()

    def __call__(self, req: Request, region: Region) -> Stage[Proposal]:
        args = ProposeBidirectional(req, region, self.cache, self.vicinity, self.smoothing, self.keep_logits)
        (proposal,) = yield [Call(Role.DRAFTER, args)]
        return proposal


@dataclass(frozen=True, slots=True)
class ARPropose:
    """Plain AR decoding: the next token of a causal LM (role ar, guider, or drafter_ar: the causal drafter)."""

    role: Role

    def __call__(self, req: Request, region: Region) -> Stage[Proposal]:
        (proposal,) = yield [Call(self.role, NextToken(req, req.frontier))]
        return proposal
