"""Verify stage: the AR guider checks the span from the frontier to the region's end in one forward.

With a filter (the pipeline), the Learn2PD scores of the same proposal are fetched at the same time: both need only
the proposal, so the round waits for the slower of the two hops instead of their sum.
"""

from concurrent.futures import ThreadPoolExecutor

from services.ar_guider.guider import Guider
from services.common.proposal import Proposal, Region, Verdict
from services.common.request import Request
from services.orchestrator.gate import FilterGate

OVERLAP = ThreadPoolExecutor(16, thread_name_prefix="dlm-overlap")


class GuiderVerify:
    def __init__(self, guider: Guider, top_k: int, scorer: FilterGate | None = None):
        self.guider, self.top_k, self.scorer = guider, top_k, scorer

    def __call__(self, req: Request, region: Region, proposal: Proposal) -> Verdict:
        scores = OVERLAP.submit(self.scorer.scores, req, region, proposal) if self.scorer else None
        start = req.frontier
        draft = req.tokens.clone()
        draft[proposal.positions] = proposal.ids
        verdict = self.guider.verify(req, start, draft[start : region.end], self.top_k)
        verdict.filter_scores = scores.result() if scores else None
        return verdict

    def release(self, request_id: str) -> None:
        self.guider.release(request_id)
