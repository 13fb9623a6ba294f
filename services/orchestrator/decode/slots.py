"""ReFusion slot decoding (000 §4.2, A.3) as the three stages of a round.

Select round: the drafter drafts every masked slot of the block (Stage I); slots whose first-token probability
exceeds tau_slot are selected (else the best one); the drafter verifies the selected drafts concatenated in logical
order (Eq. 7); the longest prefix with every probability > tau_token is kept, and if it covers whole slots, they
are decided. Otherwise completion rounds follow (Eq. 8-9): each selected slot, isolated from the others, keeps its
verified prefix and re-predicts the rest, until every selected slot is complete; a slot complete early waits, still
verified with the others, and all are committed together, in slot order, ahead of the remaining masks, with their
logical position ids.

KV (000 §4.2, C.3, Table 8): with `reuse`, the default, the verification forward that accepts a slot leaves its KV on
the drafter, and the commit takes it as it is; `recompute` recomputes the committed slots in the next forward, after
every commit before them (Table 8's "w/ KV Re-computation").
"""

from dataclasses import dataclass

import torch

from services.common.contract import Call, FillMasks, Role, ScoreDraft, Stage
from services.common.proposal import Decision, Proposal, Region, TokenLogprobs, Verdict
from services.common.request import Request
from services.orchestrator.decode.propose import CausalPropose


@dataclass(slots=True)
class SlotWork:
    starts: list[int]  # generation position of each selected slot
    drafts: list[torch.Tensor]  # per slot, its draft tokens
    first_probs: list[float]  # per slot, probability of its first draft token when it was predicted from a mask
    valid: list[int]  # per slot, verified prefix length
    completing: bool = False
    fresh: bool = False  # just entered completion: the drafts are verified in isolation before any re-prediction

    def positions(self) -> torch.Tensor:
        return torch.cat([torch.arange(s, s + len(d)) for s, d in zip(self.starts, self.drafts, strict=True)])


KV_MODES = ("reuse", "recompute")


@dataclass(frozen=True, slots=True)
class SlotPropose:
    slot_size: int
    slot_threshold: float

    def __call__(self, req: Request, region: Region) -> Stage[Proposal]:
        work: SlotWork | None = req.state.get("slots")
        if work is None:
            return (yield from self.select(req, region))
        return (yield from self.complete(req, work))

    def select(self, req: Request, region: Region) -> Stage[Proposal]:
        proposal = yield from CausalPropose()(req, region)
        first = (proposal.positions - region.start) % self.slot_size == 0
        scores = proposal.probs[first]
        chosen = scores > self.slot_threshold
        if not chosen.any():
            chosen[scores.argmax()] = True
        draft = req.tokens.clone()
        draft[proposal.positions] = proposal.ids
        starts = proposal.positions[first][chosen].tolist()
        ends = [min(s + self.slot_size, region.end) for s in starts]
        req.state["slots"] = SlotWork(
            starts, [draft[s:e] for s, e in zip(starts, ends, strict=True)], scores[chosen].tolist(), [0] * len(starts)
        )
        return proposal

    def complete(self, req: Request, work: SlotWork) -> Stage[Proposal]:
        """Re-predict, from masks, every slot's suffix past its verified prefix; slots do not see each other."""
        if work.fresh:
            work.fresh = False
            return empty_proposal()
        ids, groups = [], []
        for i, (draft, valid) in enumerate(zip(work.drafts, work.valid, strict=True)):
            ids.append(torch.cat([draft[:valid], torch.full((len(draft) - valid,), req.mask_id)]))
            groups.append(torch.full((len(draft),), i))
        filled = torch.cat(ids)
        (proposal,) = yield [Call(Role.DRAFTER, FillMasks(req, filled, work.positions(), torch.cat(groups)))]
        filled[filled == req.mask_id] = proposal.ids
        # every slot keeps a verified prefix of at least its first token (the fresh round verified it), so
        # first_probs, the probability of that token from the select forward, stays as it is
        work.drafts = list(filled.split([len(d) for d in work.drafts]))
        return proposal


def empty_proposal() -> Proposal:
    none = torch.empty(0, dtype=torch.long)
    return Proposal(none, none, torch.empty(0), torch.empty(0), torch.empty(0, 0))


@dataclass(frozen=True, slots=True)
class SlotVerify:
    """The drafter itself, causally: the output at draft token j gives the probability of token j + 1."""

    kv_reuse: bool = True  # the slots this forward accepts keep its KV (000 §4.2)

    def __call__(self, req: Request, region: Region, proposal: Proposal) -> Stage[Verdict]:
        work: SlotWork = req.state["slots"]
        draft, positions = torch.cat(work.drafts), work.positions()
        groups = torch.cat([torch.full((len(d),), i) for i, d in enumerate(work.drafts)])
        call = ScoreDraft(req, draft, positions, groups if work.completing else None, self.kv_reuse)
        (scored,) = yield [Call(Role.DRAFTER, call)]  # the verdict on draft[1:], each token under the output before
        draft_probs, target_probs = (
            torch.cat([torch.zeros(1), p.float()]) for p in (scored.draft_probs, scored.target_probs)
        )
        target = torch.cat([draft[:1], scored.target])
        firsts = torch.cat([torch.tensor([0]), torch.tensor([len(d) for d in work.drafts]).cumsum(0)[:-1]])
        draft_probs[firsts] = torch.tensor(work.first_probs)  # first tokens: Eq. 7 j = 1, from the mask forward
        target[firsts], target_probs[firsts] = draft[firsts], draft_probs[firsts]
        verdict = Verdict(positions, draft, target, target[:, None], draft_probs, target_probs)
        if scored.logprobs is not None:
            verdict.logprobs = draft_logprobs(scored.logprobs, draft_probs, firsts)
        return verdict


def draft_logprobs(scored: TokenLogprobs, draft_probs: torch.Tensor, firsts: torch.Tensor) -> TokenLogprobs:
    """The drafter's logprobs of its drafts [T], from draft[1:]'s as the drafter scored them: token j + 1 from the
    causal output at j; a slot's first token from the mask forward that predicted it, whose alternatives were not
    kept (ids -1)."""
    n = scored.top_ids.shape[1]
    top_ids = torch.cat([scored.top_ids.new_full((1, n), -1), scored.top_ids])
    top_logprobs = torch.cat([scored.top_logprobs.new_full((1, n), float("-inf")), scored.top_logprobs])
    top_ids[firsts], top_logprobs[firsts] = -1, float("-inf")
    return TokenLogprobs(draft_probs.log(), top_ids, top_logprobs, verified=False)


class SlotGate:
    def __init__(self, token_threshold: float):
        self.tau_token = token_threshold

    def __call__(self, req: Request, region: Region, proposal: Proposal, verdict: Verdict) -> Decision:
        work: SlotWork = req.state["slots"]
        ok = (verdict.draft_probs > self.tau_token).split([len(d) for d in work.drafts])
        targets = verdict.target.split([len(d) for d in work.drafts])
        if not work.completing:
            prefix = int(torch.cat(ok).long().cumprod(0).sum())
            ends = torch.tensor([len(d) for d in work.drafts]).cumsum(0)
            done = list(range(int((ends <= prefix).sum())))
            if not done:
                work.completing = work.fresh = True
                work.valid[0] = min(prefix, len(work.drafts[0]))  # the first slot's prefix holds under Eq. 8 too
        else:
            for i, slot_ok in enumerate(ok):
                kept = work.valid[i]  # Eq. 8: the verified prefix stays verified; only the re-predicted suffix counts
                if kept == len(work.drafts[i]):
                    continue  # complete: it waits for the others
                valid = kept + int(slot_ok[kept:].long().cumprod(0).sum())
                if valid == kept:  # no progress: take the drafter's own AR choice past the prefix
                    valid = kept + 1
                    work.drafts[i][kept] = targets[i][kept]
                work.valid[i] = valid
            # 000 §4.2: "This cycle repeats until all selected slots are fully decoded. Finally, the newly completed
            # slots are moved...": a slot completed early is committed with the rest, unseen by them until then
            complete = all(v == len(d) for v, d in zip(work.valid, work.drafts, strict=True))
            done = list(range(len(work.starts))) if complete else []
        if not done:
            return Decision(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long))
        decision = Decision(
            torch.cat([torch.arange(work.starts[i], work.starts[i] + len(work.drafts[i])) for i in done]),
            torch.cat([work.drafts[i] for i in done]),
        )
        if verdict.logprobs is not None:
            slots = verdict.logprobs.take(slice(None))
            # a draft replaced by the drafter's own choice (no progress) has that choice's probability
            kept = torch.cat(work.drafts) == verdict.draft
            slots.chosen = torch.where(kept, slots.chosen, verdict.target_probs.log())
            offsets = [0, *torch.tensor([len(d) for d in work.drafts]).cumsum(0).tolist()]
            decision.logprobs = TokenLogprobs.cat([slots.take(slice(offsets[i], offsets[i + 1])) for i in done])
        req.state["slots"] = None  # the select round's other slots are drafted again
        return decision
