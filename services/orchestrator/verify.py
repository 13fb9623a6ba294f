"""Verify stage: a second opinion on the proposal. The AR guider checks the span from the frontier to the region's
end in one forward; the Learn2PD filter scores the proposal's confidences.

The pipeline asks for both in the same yield: the step runs the guider's and the filter's batched calls at once, so
the round waits for the slower of the two instead of their sum.
"""

from dataclasses import dataclass

import torch

from services.common.calls import Call, Stage
from services.common.proposal import Proposal, Region, Verdict
from services.common.request import Request


def filter_call(region: Region, proposal: Proposal) -> Call:
    """The filter reads the whole region's confidences (004 Alg. 2): decided positions count as certain."""
    confidence = torch.ones(region.end - region.start)
    confidence[proposal.positions - region.start] = proposal.probs
    return Call("filter", "accept_probs", (confidence,))


def proposal_scores(scores: torch.Tensor, region: Region, proposal: Proposal) -> torch.Tensor:
    """Region scores [end - start] -> the proposal's [N]."""
    return scores[proposal.positions - region.start]


@dataclass(frozen=True, slots=True)
class GuiderVerify:
    top_k: int
    with_filter: bool = False  # the pipeline: filter scores decide which drafts past the agreement stay as context

    def __call__(self, req: Request, region: Region, proposal: Proposal) -> Stage[Verdict]:
        start = req.frontier
        draft = req.tokens.clone()
        draft[proposal.positions] = proposal.ids
        calls = [Call("guider", "verify", (req, start, draft[start : region.end], self.top_k))]
        if self.with_filter:
            calls.append(filter_call(region, proposal))
        verdict, *scores = yield calls
        if scores:
            verdict.filter_scores = proposal_scores(scores[0], region, proposal)
        return verdict


@dataclass(frozen=True, slots=True)
class FilterVerify:
    """Learn2PD (004 Alg. 2): the filter's scores are the verdict; the drafter's proposal stands as the draft."""

    def __call__(self, req: Request, region: Region, proposal: Proposal) -> Stage[Verdict]:
        (scores,) = yield [filter_call(region, proposal)]
        ids, probs = proposal.ids, proposal.probs
        verdict = Verdict(proposal.positions, ids, ids, ids[:, None], probs, probs)
        verdict.filter_scores = proposal_scores(scores, region, proposal)
        return verdict
