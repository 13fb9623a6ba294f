"""Sampled decoding against sampling loops written out here, on scripted models whose distributions the test sets:
the engine draws the same tokens from the same seed. Temperature, top-k and top-p as usual: keep the k most likely,
divide the logits by T, keep the most likely tokens until their mass reaches p, draw; the mask is never drawn."""

import pytest
import torch

from services.common.sampling import SamplingParams
from tests.scripted import EOS, MASK, ScriptedLM, draw_generators, row, scripted_engine

PROMPT = [5, 6, 7]
N = 12
SCRIPT = {p: row({10 + p: 0.4, 20 + p % 8: 0.3, 3: 0.2}) for p in range(N)}  # no EOS drawn in practice
SAMPLINGS = [SamplingParams(temperature=0.8, seed=1), SamplingParams(temperature=1.3, top_p=0.75, seed=2)]
SAMPLINGS += [SamplingParams(temperature=1.0, top_k=3, seed=3), SamplingParams(temperature=0.5, top_p=0.9, seed=4)]


def probabilities(logprobs: torch.Tensor, s: SamplingParams) -> torch.Tensor:
    """[R, V] log-probabilities -> the distribution a draw uses."""
    logits = logprobs.clone()
    logits[:, MASK] = float("-inf")
    if s.top_k:
        kth = logits.sort(-1, descending=True).values[:, s.top_k - 1 : s.top_k]
        logits[logits < kth] = float("-inf")
    probs = torch.softmax(logits / s.temperature, -1)
    for p in probs:
        mass = 0.0
        for token in p.argsort(descending=True).tolist():
            share = float(p[token])
            if mass > s.top_p:
                p[token] = 0.0
            mass += share
    return probs


def draw(logprobs: torch.Tensor, s: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    return torch.multinomial(probabilities(logprobs, s), 1, generator=generator).squeeze(-1)


def ar_loop(s: SamplingParams) -> list[int]:
    """One token per step from the model's next-token distribution."""
    generators, out = draw_generators(s.seed), []
    for p in range(N):
        token = int(draw(SCRIPT[p][None], s, next(generators))[0])
        if token == EOS:
            break
        out.append(token)
    return out


def threshold_loop(s: SamplingParams, block: int, threshold: float) -> list[int]:
    """Fast-dLLM threshold decoding, sampled: each step draws every masked token of the block (one draw over their
    rows, in position order) and keeps those whose probability under the model (before temperature) is above the
    threshold, else the most probable draw."""
    generators, canvas = draw_generators(s.seed), {}
    for lo in range(0, N, block):
        while masked := [p for p in range(lo, lo + block) if p not in canvas]:
            logprobs = torch.stack([SCRIPT[p] for p in masked])
            ids = draw(logprobs, s, next(generators))
            conf = logprobs.exp().gather(-1, ids[:, None]).squeeze(-1)
            keep = conf > threshold
            keep[conf.argmax()] |= not keep.any()
            canvas |= {p: int(t) for p, t, k in zip(masked, ids, keep, strict=True) if k}
    return [canvas[p] for p in range(N)]


@pytest.mark.parametrize("s", SAMPLINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}")
def test_ar_sampling_draws_what_a_plain_loop_draws(s):
    engine = scripted_engine({"guider": ScriptedLM(SCRIPT, len(PROMPT))}, N)
    assert engine.generate(PROMPT, "ar", {"model": "guider"}, N, s).token_ids == ar_loop(s)


@pytest.mark.parametrize("s", SAMPLINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}")
def test_threshold_sampling_draws_what_a_plain_loop_draws(s):
    model = ScriptedLM(SCRIPT, len(PROMPT), bidirectional=True)
    engine = scripted_engine({"drafter_bidirectional": model}, N)
    params = {"block_size": 4, "threshold": 0.35, "cache": "none"}
    assert engine.generate(PROMPT, "threshold", params, N, s).token_ids == threshold_loop(s, 4, 0.35)


def test_the_loops_draw_differently_from_greedy():
    greedy = [int(SCRIPT[p].argmax()) for p in range(N)]
    assert all(ar_loop(s) != greedy for s in SAMPLINGS)
