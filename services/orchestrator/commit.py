"""Commit stage: the active region of a round, and making decisions final.

region  block   blocks of `size` decoded in order; the region is the block holding the frontier
        window  the `size` positions from the frontier, refilled as the prefix grows (002 §5.2)
order   prefix  the contiguous decided prefix enters the drafter's cache (streaming commit)
        slot    decided slots enter the cache as they complete, ahead of earlier masks (000 §4.1)
"""

import torch

from services.common.proposal import Committed, Decision, Region, TokenLogprob, TokenLogprobs
from services.common.request import Request

REGIONS = ("block", "window")
ORDERS = ("prefix", "slot")


class Commit:
    def __init__(self, region: str, size: int, order: str = "prefix"):
        if region not in REGIONS or order not in ORDERS:
            raise ValueError(f"commit region must be in {REGIONS} and order in {ORDERS}")
        self.kind, self.size, self.order = region, size, order

    def region(self, req: Request) -> Region:
        start = req.frontier
        if self.kind == "block":
            start = start // self.size * self.size
        return Region(start, min(start + self.size, req.horizon))

    def __call__(self, req: Request, decision: Decision) -> Committed:
        req.decide(decision.positions, decision.ids)
        if decision.logprobs is not None:
            record(req, decision.positions, decision.logprobs)
        req.fill(decision.fill_positions, decision.fill_ids)
        frontier = req.frontier
        if self.order == "slot":
            req.commit(decision.positions.tolist())
        else:
            req.commit((~req.committed[:frontier]).nonzero().squeeze(-1).tolist())
        ids = req.tokens[req.emitted : frontier].tolist()
        req.emitted = frontier
        ahead = decision.positions[(decision.positions >= frontier) & (decision.positions < req.horizon)]
        spans = [(int(run[0]), req.tokens[run].tolist()) for run in runs(ahead.sort().values)]
        req.stats.rounds += 1
        req.stats.accepted.append(len(decision.positions))
        req.stats.on_commit(len(ids))
        if frontier == req.horizon:
            req.finish_reason = "eos" if req.tokens[frontier - 1] == req.eos_id else "length"
        req.stats.tokens = len(req.output_ids())
        logprobs = [req.logprobs[p] for p in range(frontier - len(ids), frontier)] if req.logprobs else []
        return Committed(ids, spans, req.finish_reason, logprobs)


def record(req: Request, positions: torch.Tensor, logprobs: TokenLogprobs) -> None:
    for i, pos in enumerate(positions.tolist()):
        alternatives = zip(logprobs.top_ids[i].tolist(), logprobs.top_logprobs[i].tolist(), strict=True)
        top = [(t, lp) for t, lp in alternatives if t >= 0]
        req.logprobs[pos] = TokenLogprob(float(logprobs.chosen[i]), top, logprobs.verified)


def runs(positions: torch.Tensor) -> list[torch.Tensor]:
    """Split sorted positions into runs of consecutive values."""
    if len(positions) == 0:
        return []
    return list(positions.tensor_split((positions.diff() != 1).nonzero().squeeze(-1) + 1))
