"""The bidirectional drafter one request at a time (in-process decode loop, filter training, the unbatched
deployment path): holds each request's BlockCache and counts the forward in the request's stats."""

from transformers import DynamicCache

from services.common.proposal import Proposal, Region
from services.common.request import Request
from services.dlm_drafter.bidirectional import BidirectionalCall, BidirectionalDrafter, BlockCache, Smoothing


class SerialBidirectionalDrafter:
    family = "bidirectional"

    def __init__(self, drafter: BidirectionalDrafter, cache: str = "none", smoothing: Smoothing | None = None):
        self.drafter, self.cache, self.smoothing = drafter, cache, smoothing
        self.states: dict[str, BlockCache] = {}

    def propose(self, req: Request, region: Region) -> Proposal:
        state = self.states.setdefault(req.id, BlockCache(DynamicCache()))
        call = BidirectionalCall(req, region, state, self.cache, self.smoothing)
        proposal, tokens = self.drafter.propose_batch([call])[0]
        req.stats.drafter_forwards += 1
        req.stats.drafter_tokens_processed += tokens
        return proposal

    def release(self, request_id: str) -> None:
        self.states.pop(request_id, None)
