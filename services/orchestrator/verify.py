"""Verify stage: the AR guider checks the span from the frontier to the region's end in one forward."""

from services.ar_guider.guider import Guider
from services.common.proposal import Proposal, Region, Verdict
from services.common.request import Request


class GuiderVerify:
    def __init__(self, guider: Guider, top_k: int):
        self.guider = guider
        self.top_k = top_k

    def __call__(self, req: Request, region: Region, proposal: Proposal) -> Verdict:
        start = req.frontier
        draft = req.tokens.clone()
        draft[proposal.positions] = proposal.ids
        return self.guider.verify(req, start, draft[start : region.end], self.top_k)

    def release(self, request_id: str) -> None:
        self.guider.release(request_id)
