"""Per-token logprobs recorded by the engine: one per committed token, from the distribution that decided it."""

import pytest
import torch

from services.common.sampling import Rng, SamplingParams, choose
from tests.orchestrator.api.test_server import PROMPT

CASES = {
    "ar": ({"model": "guider"}, False),  # the guider proposes: its own distribution, but no verification
    "guided": ({"block_size": 8}, False),  # follow=drafter: the drafter's tokens, its distribution
    "pipeline": ({"window": 6}, False),
    "guided-guider": ({"block_size": 8, "follow": "guider"}, True),  # the guider verifies: its distribution
    "pipeline-guider": ({"window": 6, "follow": "guider"}, True),
    "streaming": ({"window": 6}, False),
    "slot": ({"slot_size": 4, "block_size": 8}, False),
    "credit": ({"drafter": "causal", "block_size": 8}, False),
    "learn2pd": ({"drafter": "causal", "block_size": 8}, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_logprob_per_committed_token_from_the_deciding_model(engine, case):
    params, verified = CASES[case]
    strategy = case.split("-")[0]
    events = []
    result = engine.generate(PROMPT, strategy, params, 16, SamplingParams(logprobs=2), on_output=events.append)
    logprobs = [lp for e in events for lp in e.logprobs]
    assert len(logprobs) == sum(len(e.ids) for e in events) >= len(result.token_ids)
    assert all(lp.logprob <= 0 and len(lp.top) <= 2 for lp in logprobs)
    assert all(lp.verified == verified for lp in logprobs)
    if strategy in ("ar", "guided", "pipeline", "streaming"):  # greedy under the deciding distribution
        assert all(lp.top and lp.top[0][1] == pytest.approx(lp.logprob, abs=1e-5) for lp in logprobs)
    plain = engine.generate(PROMPT, strategy, params, 16)
    assert plain.token_ids == result.token_ids  # recording changes nothing


def test_no_logprobs_unless_asked(engine):
    events = []
    engine.generate(PROMPT, "pipeline", {"window": 6}, 8, on_output=events.append)
    assert events and not any(e.logprobs for e in events)


def test_top_k_keeps_only_the_k_most_likely():
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0]]).repeat(200, 1)
    rng = Rng(0)
    picks = choose(logits, SamplingParams(temperature=5.0, top_k=2), rng)
    assert set(picks.tolist()) == {1, 2}
    assert set(choose(logits, SamplingParams(temperature=5.0), rng).tolist()) == {0, 1, 2, 3}
