"""Verify stage: a second opinion on the proposal. The AR guider checks the span from the frontier to the region's
end in one forward; the Learn2PD filter scores the proposal's confidences.

The pipeline asks for both in the same yield: the step runs the guider's and the filter's batched calls at once, so
the round waits for the slower of the two instead of their sum.
"""

from dataclasses import dataclass

import torch

from services.common.contract import AcceptProbs, Call, Role, Stage, Verify
from services.common.proposal import Proposal, Region, Verdict
from services.common.request import Request


def filter_call(drafter: str, region: Region, proposal: Proposal) -> Call:
    """The filter of the proposing drafter's family reads the whole region's confidences (004 Alg. 2): decided
    positions count as certain."""
    confidence = torch.ones(region.end - region.start)
    confidence[proposal.positions - region.start] = proposal.probs
    return Call(Role.FILTER, AcceptProbs(drafter, confidence))


def drafts(req: Request, region: Region, proposal: Proposal) -> torch.Tensor:
    """The canvas from the frontier to the region's end with the proposal in it: [region.end - frontier] tokens, what
    the guider checks and a round may accept (a kept tentative draft where the proposal has none)."""
    canvas = req.tokens.clone()
    canvas[proposal.positions] = proposal.ids
    return canvas[req.frontier : region.end]


def proposal_scores(scores: torch.Tensor, region: Region, proposal: Proposal) -> torch.Tensor:
    """Region scores [end - start] -> the proposal's [N]."""
    return scores[proposal.positions - region.start]


@dataclass(frozen=True, slots=True)
class GuiderVerify:
    top_k: int
    filter_drafter: str | None = None  # the pipeline: the drafter family whose filter scores decide which drafts
    # past the agreement stay as context

    def __call__(self, req: Request, region: Region, proposal: Proposal) -> Stage[Verdict]:
        calls = [Call(Role.GUIDER, Verify(req, req.frontier, drafts(req, region, proposal), self.top_k))]
        if self.filter_drafter:
            calls.append(filter_call(self.filter_drafter, region, proposal))
        verdict, *scores = yield calls
        if scores:
            verdict.filter_scores = proposal_scores(scores[0], region, proposal)
        return verdict


@dataclass(frozen=True, slots=True)
class FilterVerify:
    """Learn2PD (004 Alg. 2): the filter's scores are the verdict; the drafter's proposal stands as the draft."""

    drafter: str  # the proposing drafter's family, whose filter scores it

    def __call__(self, req: Request, region: Region, proposal: Proposal) -> Stage[Verdict]:
        (scores,) = yield [filter_call(self.drafter, region, proposal)]
        ids, probs = proposal.ids, proposal.probs
        verdict = Verdict(proposal.positions, ids, ids, ids[:, None], probs, probs)
        verdict.filter_scores = proposal_scores(scores, region, proposal)
        return verdict
