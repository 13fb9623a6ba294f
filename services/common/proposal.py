"""What flows between the stages of a round: a drafter's proposal, a verifier's verdict, a gate's decision."""

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from services.common.sampling import Rng, SamplingParams, choose


@dataclass(slots=True)
class Region:
    start: int  # generation positions [start, end) are active this round
    end: int


@dataclass(slots=True)
class TokenLogprobs:
    """Logprobs of chosen tokens under the distribution that decided them (raw model logits, before temperature),
    recorded only when a request asks (SamplingParams.logprobs = N)."""

    chosen: torch.Tensor  # [A] logprob of each chosen token
    top_ids: torch.Tensor  # [A, N] the N most likely tokens; -1 where that distribution was not kept
    top_logprobs: torch.Tensor  # [A, N]
    verified: bool  # the guider's distribution (else the drafter's)

    def take(self, index: torch.Tensor | slice) -> "TokenLogprobs":
        return TokenLogprobs(self.chosen[index], self.top_ids[index], self.top_logprobs[index], self.verified)

    @staticmethod
    def cat(parts: list["TokenLogprobs"]) -> "TokenLogprobs":
        return TokenLogprobs(
            torch.cat([p.chosen for p in parts]),
            torch.cat([p.top_ids for p in parts]),
            torch.cat([p.top_logprobs for p in parts]),
            parts[0].verified,
        )


def token_logprobs(logp: torch.Tensor, ids: torch.Tensor, n: int, verified: bool) -> TokenLogprobs:
    """log-softmaxed logits [A, V] and chosen ids [A] -> their logprobs and the top n alternatives."""
    top = logp.topk(min(n, logp.shape[-1]), -1)
    chosen = logp.gather(-1, ids.to(logp.device)[:, None]).squeeze(-1)
    return TokenLogprobs(chosen.cpu(), top.indices.cpu(), top.values.cpu(), verified)


@dataclass(slots=True)
class TokenLogprob:
    """One committed token's logprob, as a response reports it."""

    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first
    verified: bool


@dataclass(slots=True)
class Proposal:
    positions: torch.Tensor  # [N] generation positions that were masked
    ids: torch.Tensor  # [N] chosen tokens
    probs: torch.Tensor  # [N] probability of the chosen token (confidence)
    entropy: torch.Tensor  # [N]
    logits: torch.Tensor | None  # [N, V], the mask token not banned; None where it crossed a hop to a gate not using it
    logprobs: TokenLogprobs | None = None  # the drafter's, when the request asks


def without_logits(proposal: Proposal, keep: bool) -> Proposal:
    """The full distribution goes back only to gates that fuse it (credit decoding): it is most of a hop's bytes."""
    if not keep:
        proposal.logits = None
    return proposal


@dataclass(slots=True)
class Verdict:
    positions: torch.Tensor  # [M] contiguous span from the frontier
    draft: torch.Tensor  # [M] tokens that were verified
    target: torch.Tensor  # [M] verifier's argmax at each position given the drafts before it
    topk: torch.Tensor  # [M, K] verifier's top-k ids
    draft_probs: torch.Tensor  # [M] verifier's probability of each draft token
    target_probs: torch.Tensor  # [M] verifier's probability of its argmax
    filter_scores: torch.Tensor | None = None  # [N] Learn2PD scores of the proposal, fetched alongside
    logprobs: TokenLogprobs | None = None  # [M] of the drafts, when the request asks
    target_logprobs: torch.Tensor | None = None  # [M] of the verifier's argmax, when the request asks


@dataclass(slots=True)
class Decision:
    positions: torch.Tensor  # [A] positions decided this round
    ids: torch.Tensor  # [A]
    fill_positions: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    fill_ids: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))  # tentative drafts
    logprobs: TokenLogprobs | None = None  # [A], when the request asks


def never_mask(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """No model may choose the mask token as output."""
    if mask_id < 0:
        return logits
    return logits.index_fill(-1, torch.tensor([mask_id], device=logits.device), float("-inf"))


class LogitMaths(Protocol):
    """What a proposal and a verdict read of a model's distributions, the mask token banned (never_mask): torch's
    ops (TORCH_MATHS), or in float32 on the CPU one fused pass a row (cpu_kernels.CpuKernels), chosen with the
    decoder's other ops (lean_ops.Ops)."""

    def proposal_stats(self, logits: Tensor, ids: Tensor | None, mask_id: int) -> tuple[Tensor, Tensor, Tensor]:
        """logits [N, V], the chosen ids [N] (None: each row's first maximum) -> the ids, their probabilities and
        each row's entropy, [N] each."""
        ...

    def verdict_stats(self, logits: Tensor, draft: Tensor, mask_id: int) -> tuple[Tensor, Tensor, Tensor]:
        """logits [M, V], draft [M] -> each row's first maximum, its probability and the draft's, [M] each."""
        ...


class TorchLogitMaths:
    """LogitMaths as torch ops: any device and dtype."""

    @staticmethod
    def proposal_stats(logits: Tensor, ids: Tensor | None, mask_id: int) -> tuple[Tensor, Tensor, Tensor]:
        logits = never_mask(logits, mask_id)
        ids = logits.max(-1).indices if ids is None else ids  # choose's greedy pick
        logp = torch.log_softmax(logits, -1)
        entropy = -(logp.exp() * logp).nansum(-1)  # 0 * -inf at the masked token: nan, skipped
        return ids, logp.gather(-1, ids[:, None]).squeeze(-1).exp(), entropy

    @staticmethod
    def verdict_stats(logits: Tensor, draft: Tensor, mask_id: int) -> tuple[Tensor, Tensor, Tensor]:
        probs = torch.softmax(never_mask(logits, mask_id), -1)
        top, target = probs.max(-1)
        return target, top, probs.gather(-1, draft[:, None]).squeeze(-1)


TORCH_MATHS = TorchLogitMaths()


def propose_from_logits(
    positions: torch.Tensor,
    logits: torch.Tensor,
    sampling: SamplingParams,
    rng: Rng,
    mask_id: int,
    maths: LogitMaths = TORCH_MATHS,
) -> Proposal:
    logits = logits.float()
    top_n = sampling.logprobs
    banned = never_mask(logits, mask_id) if not sampling.greedy or top_n is not None else None  # where read whole
    chosen = None if sampling.greedy else choose(banned, sampling, rng)
    ids, probs, entropy = maths.proposal_stats(logits, chosen, mask_id)
    logprobs = None
    if top_n is not None:
        logprobs = token_logprobs(torch.log_softmax(banned, -1), ids, top_n, verified=False)
    return Proposal(positions.cpu(), ids.cpu(), probs.cpu(), entropy.cpu(), logits.cpu(), logprobs)


@dataclass(slots=True)
class Committed:
    """What one round made final: the new contiguous text, slots committed ahead of it, and the finish."""

    ids: list[int]  # tokens that extended the committed contiguous prefix
    spans: list[tuple[int, list[int]]]  # (logical offset, ids) committed out of logical order
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per id, when the request asks
