"""Sampling parameters and token choice: greedy by default, temperature / top-k / top-p, deterministic per seed."""

import secrets
from dataclasses import dataclass

import torch

MASK64 = (1 << 64) - 1


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    top_k: int = 0  # 0: off
    logprobs: int | None = None  # record each token's logprob and this many top alternatives; None: off

    def __post_init__(self):
        if not self.temperature >= 0:  # NaN too
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def fresh_seed() -> int:
    """A seed for a request that set none; 53 bits, so that JSON clients read it back exactly."""
    return secrets.randbits(53)


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit ints whose outputs for nearby inputs look unrelated."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


@dataclass(slots=True)
class Rng:
    """A request's sampling randomness, counter-based (as JAX folds a counter into a key): its draw k samples from a
    generator seeded by (seed, k). The whole state is two ints, so it crosses a hop, comes back in a reply and stands
    in the cache index's record for nothing, and whichever process holds them draws what the request's next draw
    would: a host samples where its logits are, and only the count comes back."""

    seed: int
    draws: int = 0  # draws made so far

    def generator(self) -> torch.Generator:
        """The next draw's generator; counts the draw."""
        generator = torch.Generator().manual_seed(mix64(mix64(self.seed & MASK64) ^ self.draws))
        self.draws += 1
        return generator

    def copy(self) -> "Rng":
        return Rng(self.seed, self.draws)


def choose(logits: torch.Tensor, params: SamplingParams, rng: Rng | None) -> torch.Tensor:
    """Pick one token per row of logits [N, V] -> ids [N]; a sampled pick is one draw of rng (None: greedy only)."""
    if params.greedy:
        return logits.max(-1).indices  # the first maximum, as argmax, at about half argmax's cost on CPU
    logits = logits.float()
    if 0 < params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, -1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    # From the row's maximum down, and the temperature within float32's range, so that none gives NaN: a tiny one
    # leaves 0 at the argmax and -inf elsewhere (greedy in the limit), a huge one keeps masked -inf logits -inf.
    shifted = logits - logits.max(-1, keepdim=True).values
    finfo = torch.finfo(logits.dtype)
    probs = torch.softmax(shifted / min(max(params.temperature, finfo.tiny), finfo.max), -1)
    if params.top_p < 1:
        sorted_probs, order = probs.sort(-1, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs > params.top_p
        sorted_probs[drop] = 0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs.cpu(), 1, generator=rng.generator()).squeeze(-1).to(logits.device)
