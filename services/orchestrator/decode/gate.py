"""Gate stage: which proposals become decided this round. Every gate decides at least one token (progress)."""

import math
from dataclasses import dataclass

import torch

from services.common.proposal import Decision, Proposal, Region, TokenLogprobs, Verdict, never_mask, token_logprobs
from services.common.request import Request
from services.common.sampling import choose


def pick(proposal: Proposal, accept: torch.Tensor, score: torch.Tensor) -> Decision:
    """Accept the masked proposals, or the best-scoring one when none passed."""
    if not accept.any():
        accept = torch.zeros_like(accept)
        accept[score.argmax()] = True
    logprobs = proposal.logprobs.take(accept) if proposal.logprobs is not None else None
    return Decision(proposal.positions[accept], proposal.ids[accept], logprobs=logprobs)


def block_state(req: Request, key: str, region: Region, init):
    """Per-block state that resets when the region moves to a new block."""
    start, value = req.state.get(key, (None, None))
    if start != region.start:
        value = init()
        req.state[key] = (region.start, value)
    return value


@dataclass(frozen=True, slots=True)
class Schedule:
    """A gate's confidence threshold at a request's diffusion iteration t (its rounds so far, dInfer's iter_no).
    With a decay (IterSmooth, 001 A.1) it falls from 1.0 toward the target, max(1 - decay * t, target) as in
    dInfer's code; without, it is the target."""

    target: float
    decay: float | None = None

    def at(self, req: Request) -> float:
        if self.decay is None:
            return self.target
        return max(1.0 - self.decay * req.stats.rounds, self.target)


class AcceptAll:
    def __call__(self, req: Request, region: Region, proposal: Proposal, verdict: Verdict | None) -> Decision:
        return Decision(proposal.positions, proposal.ids, logprobs=proposal.logprobs)


class TopN:
    """LLaDA low-confidence remasking (004 §3.1.1): a fixed number of steps per block, most confident first."""

    def __init__(self, steps_per_block: int):
        self.steps = steps_per_block

    def __call__(self, req: Request, region: Region, proposal: Proposal, verdict: Verdict | None) -> Decision:
        done = block_state(req, "topn", region, lambda: [0])
        n = math.ceil(len(proposal.positions) / max(self.steps - done[0], 1))
        done[0] += 1
        accept = torch.zeros(len(proposal.positions), dtype=torch.bool)
        accept[proposal.probs.topk(min(n, len(accept))).indices] = True
        return pick(proposal, accept, proposal.probs)


class Threshold:
    """Fast-dLLM threshold decoding (001 §2.2): commit every token whose confidence exceeds the threshold."""

    def __init__(self, threshold: float, decay: float | None = None):
        self.threshold = Schedule(threshold, decay)

    def __call__(self, req: Request, region: Region, proposal: Proposal, verdict: Verdict | None) -> Decision:
        return pick(proposal, proposal.probs > self.threshold.at(req), proposal.probs)


class Credit:
    """Credit decoding (001 B.2): C <- beta*C + p^gamma on the top token; logits + alpha*log(1 + C), from which the
    request's sampling (argmax when greedy) chooses; threshold on the chosen token's fused probability."""

    def __init__(self, threshold: float, beta: float, gamma: float, alpha: float, decay: float | None = None):
        self.threshold, self.beta, self.gamma, self.alpha = Schedule(threshold, decay), beta, gamma, alpha

    def __call__(self, req: Request, region: Region, proposal: Proposal, verdict: Verdict | None) -> Decision:
        logits = never_mask(proposal.logits, req.mask_id)  # [N, V]
        credit = block_state(req, "credit", region, lambda: torch.zeros(region.end - region.start, logits.shape[-1]))
        rows = proposal.positions - region.start
        probs = torch.softmax(logits, -1)  # [N, V]
        top_p, top = probs.max(-1)
        credit[rows] *= self.beta
        credit[rows, top] += top_p**self.gamma
        fused_logits = logits + self.alpha * torch.log1p(credit[rows])
        fused = torch.softmax(fused_logits, -1)
        ids = choose(fused_logits, req.sampling, req.rng)  # B.2 replaces the distribution, not the sampling
        conf = fused.gather(-1, ids[:, None]).squeeze(-1)
        fused_proposal = Proposal(proposal.positions, ids, conf, proposal.entropy, proposal.logits)
        if proposal.logprobs is not None:  # the fused distribution decided
            n = proposal.logprobs.top_ids.shape[-1]
            fused_proposal.logprobs = token_logprobs(fused.log(), ids, n, verified=False)
        return pick(fused_proposal, conf > self.threshold.at(req), conf)


class Hierarchical:
    """Hierarchical decoding (001 B.1): every token above the threshold, plus one token in each contiguous masked
    span: of the span's tokens above the lower bound, the one nearest its centre (the more confident of two equally
    near). A decided centre splits its span in two, so the masked regions shrink recursively: a block whose tokens
    all clear the lower bound is decoded in about log2(size) forwards, one token per region each forward."""

    def __init__(self, threshold: float, low_threshold: float, decay: float | None = None):
        self.threshold, self.low = Schedule(threshold, decay), low_threshold

    def __call__(self, req: Request, region: Region, proposal: Proposal, verdict: Verdict | None) -> Decision:
        accept = proposal.probs > self.threshold.at(req)
        for span in spans(proposal.positions):
            probs = proposal.probs[span]
            candidates = (probs > self.low).nonzero().squeeze(-1)
            if len(candidates) == 0:
                continue
            pos = proposal.positions[span].float()
            distance = (pos[candidates] - pos.mean()).abs()
            nearest = candidates[distance == distance.min()]
            accept[span[nearest[probs[nearest].argmax()]]] = True
        return pick(proposal, accept, proposal.probs)


def spans(positions: torch.Tensor) -> list[torch.Tensor]:
    """Indices into positions [N] grouped into runs of consecutive positions."""
    out, start = [], 0
    for run in runs(positions.tolist()):
        out.append(torch.arange(start, start + len(run)))
        start += len(run)
    return out


def runs(positions: list[int]) -> list[list[int]]:
    """Split positions into runs of consecutive values (each one more than the one before): short lists, where Python
    costs less than a torch op each."""
    out: list[list[int]] = []
    for p in positions:
        if out and p == out[-1][-1] + 1:
            out[-1].append(p)
        else:
            out.append([p])
    return out


class EntropyWindow:
    """WeDLM streaming selection (002 Eq. 11): H_i + lambda * d_i < tau, d_i the distance to the leftmost mask."""

    def __init__(self, entropy_threshold: float, distance_penalty: float):
        self.tau, self.lam = entropy_threshold, distance_penalty

    def __call__(self, req: Request, region: Region, proposal: Proposal, verdict: Verdict | None) -> Decision:
        adjusted = proposal.entropy + self.lam * (proposal.positions - proposal.positions.min())
        return pick(proposal, adjusted < self.tau, -adjusted)


class FilterGate:
    """Learn2PD (004 Alg. 2): accept the proposals whose filter score (the verdict of FilterVerify) clears the
    threshold."""

    def __init__(self, threshold: float):
        self.threshold = threshold

    def __call__(self, req: Request, region: Region, proposal: Proposal, verdict: Verdict) -> Decision:
        return pick(proposal, verdict.filter_scores > self.threshold, verdict.filter_scores)


FOLLOW = ("drafter", "guider")


class GuiderAgreement:
    """FlashDLM guided unmasking (003 Alg. 1, C.4): from the frontier, the longest run of drafts the guider agrees with
    (its choice, or with top_k_match > 1 in its top-k with drafter probability > guidance_threshold * guider max
    probability) is decided. What the output follows:

    drafter  Alg. 1: the run is unmasked with the drafter's tokens, and where nothing agrees the first masked position
             takes the drafter's token. With the filter's scores (the pipeline), the drafts the filter keeps count
             as agreeing, so the filter and the guider together decide how long the accepted run of drafter tokens
             is; a kept draft past the run's end is not decided (README, Strategies: it costs accuracy).
    guider   speculative decoding of the guider with the drafter drafting: where nothing agrees, the guider's token;
             bonus_token also decides the guider's token at the first disagreement; the drafts past the agreement
             that the filter keeps stay as tentative context for the next round.
    """

    def __init__(
        self,
        top_k_match: int,
        guidance_threshold: float,
        bonus_token: bool,
        keep_threshold: float = 1.0,
        follow: str = "drafter",
    ):
        self.k, self.tau, self.bonus, self.keep = top_k_match, guidance_threshold, bonus_token, keep_threshold
        self.follow = follow

    def __call__(self, req: Request, region: Region, proposal: Proposal, verdict: Verdict) -> Decision:
        at = proposal.positions - verdict.positions[0]  # [N] each proposal's index in the verified span
        match = verdict.draft == verdict.target
        if self.k > 1:
            drafter_probs = torch.ones(len(verdict.positions))
            drafter_probs[at] = proposal.probs
            in_topk = (verdict.topk[:, : self.k] == verdict.draft[:, None]).any(-1)
            match |= in_topk & (drafter_probs > self.tau * verdict.target_probs)
        if self.follow == "drafter":
            return self.drafter_tokens(proposal, verdict, match, at)
        return self.guider_tokens(proposal, verdict, match)

    def drafter_tokens(self, proposal: Proposal, verdict: Verdict, match: torch.Tensor, at: torch.Tensor) -> Decision:
        agree = match.clone()
        if verdict.filter_scores is not None:
            agree[at[verdict.filter_scores > self.keep]] = True
        n = leading_run(agree)
        accept = at < n  # past the first draft neither model vouches for, the guider's verdicts read a rejected token
        accept[0] = True  # i_1, the first masked position: the drafter's token even where nothing agrees
        logprobs = proposal.logprobs.take(accept) if proposal.logprobs is not None else None
        return Decision(proposal.positions[accept], proposal.ids[accept], logprobs=logprobs)

    def guider_tokens(self, proposal: Proposal, verdict: Verdict, match: torch.Tensor) -> Decision:
        n = leading_run(match)
        ids, logprobs = verdict.draft[:n], verdict.logprobs
        if n < len(match) and (n == 0 or self.bonus):
            ids = torch.cat([ids, verdict.target[n : n + 1]])
            if logprobs is not None:
                logprobs = bonus_logprobs(logprobs, verdict.target_logprobs, n)
            n += 1
        decision = Decision(verdict.positions[:n], ids, logprobs=logprobs.take(slice(0, n)) if logprobs else None)
        if verdict.filter_scores is not None:
            kept = (proposal.positions > verdict.positions[n - 1]) & (verdict.filter_scores > self.keep)
            decision.fill_positions, decision.fill_ids = proposal.positions[kept], proposal.ids[kept]
        return decision


def leading_run(agree: torch.Tensor) -> int:
    """The length of the leading run of True in agree [M]: one copy to Python, where a cumulative product takes
    four ops."""
    flags = agree.tolist()
    return flags.index(False) if False in flags else len(flags)


def bonus_logprobs(drafts: TokenLogprobs, target: torch.Tensor, n: int) -> TokenLogprobs:
    """The drafts' logprobs with position n's chosen token replaced by the verifier's argmax."""
    chosen = drafts.chosen.clone()
    chosen[n] = target[n]
    return TokenLogprobs(chosen, drafts.top_ids, drafts.top_logprobs, drafts.verified)
