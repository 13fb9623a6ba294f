"""Commit stage: the active region of a round, and making decisions final.

region  block     blocks of `size` decoded in order; the region is the block holding the frontier
        window    WeDLM's window (002 Alg. 1): `size` slots from the first position not yet in the drafter's cache,
                  the frontier before the last round; tokens decided but not yet cached (filled, uncommitted in
                  Alg. 1's terms) keep their slots, and the window is refilled as the commits move its start
        frontier  the `size` positions from the frontier: the span a verifier checks (guided, pipeline), AR's next token
order   prefix    the contiguous decided prefix enters the drafter's cache (streaming commit)
        slot      decided slots enter the cache as they complete, ahead of earlier masks (000 §4.1)
eos     truncate  the first decided EOS ends the canvas: later forwards see nothing past it (000 B.1; causal decoding)
        full      every position stays in context to the canvas end (LLaDA, Fast-dLLM); the output ends at the EOS
        fill      a decided EOS decides every undecided position after it as EOS, kept in context (dInfer, 001 §3)
        eotp      full, but decoding stops at the end of a block once an EOS is decided (Learn2PD EoTP, 004 Alg. 3)
Whatever the policy, the output and the stream end at the first EOS: nothing decided after it is ever sent.
"""

import torch

from services.common.proposal import Committed, Decision, Region, TokenLogprob, TokenLogprobs
from services.common.request import Request
from services.orchestrator.decode.gate import runs

REGIONS = ("block", "window", "frontier")
ORDERS = ("prefix", "slot")
EOS_POLICIES = ("truncate", "full", "fill", "eotp")


class Commit:
    def __init__(self, region: str, size: int, order: str = "prefix", eos: str = "truncate"):
        if region not in REGIONS or order not in ORDERS or eos not in EOS_POLICIES:
            raise ValueError(f"commit region must be in {REGIONS}, order in {ORDERS} and eos in {EOS_POLICIES}")
        if eos == "eotp" and region != "block":
            raise ValueError("eos 'eotp' stops at a block's end: it needs region 'block'")
        self.kind, self.size, self.order, self.eos = region, size, order, eos

    def region(self, req: Request) -> Region:
        return self.region_at(req.frontier, req.horizon, req.state)

    def region_at(self, frontier: int, horizon: int, state: dict) -> Region:
        """The region of a request with this frontier, horizon and strategy state."""
        start = frontier
        if self.kind == "block":
            start = start // self.size * self.size
        elif self.kind == "window":
            uncached = state.get("uncached", start)
            if start < uncached + self.size:  # else every slot is filled: Alg. 1's next forward would only commit
                start = uncached
        return Region(start, min(start + self.size, horizon))

    def __call__(self, req: Request, decision: Decision) -> Committed:
        if self.kind == "window":  # committed before this round, so cached by the next forward: the window starts here
            req.state["uncached"] = req.frontier
        req.decide(decision.positions, decision.ids)
        if decision.logprobs is not None:
            record(req, decision.positions, decision.logprobs)
        req.fill(decision.fill_positions, decision.fill_ids)
        eos = self.settle_eos(req)
        frontier = req.frontier
        if self.order == "slot":
            req.commit(decision.positions.tolist())
        else:
            req.commit((~req.committed[:frontier]).nonzero().squeeze(-1).tolist())
        end = req.end_after(eos)
        sent = min(frontier, end)  # the stream ends at the first EOS
        ids = req.tokens[req.emitted : sent].tolist()
        req.emitted = sent
        ahead = sorted(p for p in decision.positions.tolist() if frontier <= p < end)
        spans = [(run[0], req.tokens[run[0] : run[-1] + 1].tolist()) for run in runs(ahead)]
        req.stats.rounds += 1
        req.stats.accepted.append(len(decision.positions))
        req.stats.on_commit(len(ids))
        if self.done(req, frontier, end):
            req.finish_reason = "eos" if eos is not None else "length"
        req.stats.tokens = sent  # every token id streamed, the EOS included: the count of usage.completion_tokens
        logprobs = [req.logprobs[p] for p in range(sent - len(ids), sent)] if req.logprobs else []
        return Committed(ids, spans, req.finish_reason, logprobs)

    def settle_eos(self, req: Request) -> int | None:
        """What a decided EOS does to the canvas the models see next. -> the first decided EOS's position, which
        settling leaves where it is."""
        eos = req.first_eos
        if eos is None:
            return None
        if self.eos == "truncate":
            req.horizon = min(req.horizon, eos + 1)
        elif self.eos == "fill":
            tail = (~req.decided[eos + 1 : req.horizon]).nonzero().squeeze(-1) + eos + 1
            req.decide(tail, torch.full_like(tail, req.eos_id))
        return eos

    def done(self, req: Request, frontier: int, end: int) -> bool:
        """The whole canvas is decided, or (EoTP) a block has ended with an EOS decided before its end."""
        if frontier == req.horizon:
            return True
        return self.eos == "eotp" and end <= frontier and frontier % self.size == 0


def record(req: Request, positions: torch.Tensor, logprobs: TokenLogprobs) -> None:
    for i, pos in enumerate(positions.tolist()):
        alternatives = zip(logprobs.top_ids[i].tolist(), logprobs.top_logprobs[i].tolist(), strict=True)
        top = [(t, lp) for t, lp in alternatives if t >= 0]
        req.logprobs[pos] = TokenLogprob(float(logprobs.chosen[i]), top, logprobs.verified)
