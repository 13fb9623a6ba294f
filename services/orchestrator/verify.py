"""Verify stages: the AR guider checks the span from the frontier to the region's end in one forward; the Learn2PD
filter scores a proposal's confidences.

With a filter (the pipeline), the Learn2PD scores of the same proposal are fetched at the same time: both need only
the proposal, so the round waits for the slower of the two hops instead of their sum.
"""

from concurrent.futures import ThreadPoolExecutor

import torch

from services.ar_guider.guider import Guider
from services.common.proposal import Proposal, Region, Verdict
from services.common.request import Request
from services.filter.model import Learn2PDFilter

OVERLAP = ThreadPoolExecutor(16, thread_name_prefix="dlm-overlap")


class FilterScores:
    """Learn2PD (004 Alg. 2): the filter scores the block's confidences; decided positions count as certain."""

    def __init__(self, model: Learn2PDFilter):
        self.model = model

    def __call__(self, req: Request, region: Region, proposal: Proposal) -> torch.Tensor:
        """-> scores [N] aligned with proposal.positions."""
        confidence = torch.ones(region.end - region.start)
        confidence[proposal.positions - region.start] = proposal.probs
        req.stats.filter_calls += 1
        return self.model.accept_probs(confidence, req.id)[proposal.positions - region.start]


class FilterVerify:
    """The filter alone as the verifier (learn2pd): a verdict on the proposal that carries only its scores."""

    def __init__(self, scorer: FilterScores):
        self.scorer = scorer

    def __call__(self, req: Request, region: Region, proposal: Proposal) -> Verdict:
        ids, probs = proposal.ids, proposal.probs
        verdict = Verdict(proposal.positions, ids, ids, ids[:, None], probs, probs)
        verdict.filter_scores = self.scorer(req, region, proposal)
        return verdict


class GuiderVerify:
    def __init__(self, guider: Guider, top_k: int, scorer: FilterScores | None = None):
        self.guider, self.top_k, self.scorer = guider, top_k, scorer

    def __call__(self, req: Request, region: Region, proposal: Proposal) -> Verdict:
        scores = OVERLAP.submit(self.scorer, req, region, proposal) if self.scorer else None
        start = req.frontier
        draft = req.tokens.clone()
        draft[proposal.positions] = proposal.ids
        verdict = self.guider.verify(req, start, draft[start : region.end], self.top_k)
        verdict.filter_scores = scores.result() if scores else None
        return verdict

    def release(self, request_id: str) -> None:
        self.guider.release(request_id)
