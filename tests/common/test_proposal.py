"""Proposals from logits: no model may choose the mask token, and confidences and entropies are the distribution's."""

import math

import pytest
import torch

from services.common.proposal import never_mask, propose_from_logits
from services.common.sampling import Rng, SamplingParams, choose
from tests.scripted import draw_generators


def test_never_mask_bans_the_mask_token_even_at_id_zero():
    logits = torch.tensor([[5.0, 1.0, 0.0]])
    assert never_mask(logits, 0)[0].tolist() == [float("-inf"), 1.0, 0.0]
    assert never_mask(logits, -1).equal(logits)  # a model without a mask token


def test_proposal_confidence_and_entropy():
    logits = torch.tensor([[0.0, 0.0, 0.0, 9.0], [math.log(3), 0.0, 0.0, 0.0]])
    prop = propose_from_logits(torch.tensor([4, 7]), logits, SamplingParams(), Rng(0), mask_id=3)
    assert prop.ids.tolist() == [0, 0] and prop.positions.tolist() == [4, 7]
    assert torch.allclose(prop.probs, torch.tensor([1 / 3, 0.6]))
    assert torch.allclose(prop.entropy[0], torch.tensor(math.log(3)))


def test_sampling_is_one_draw_of_the_requests_rng():
    def draw(rng: Rng) -> torch.Tensor:
        return propose_from_logits(torch.arange(64), torch.zeros(64, 50), SamplingParams(1.0), rng, -1).ids

    torch.manual_seed(0)
    rng = Rng(1)
    first = draw(rng)
    assert rng.draws == 1
    torch.manual_seed(1)  # the global generator plays no part
    assert draw(Rng(1)).equal(first) and not draw(Rng(2)).equal(first) and not draw(rng).equal(first)
    reference = torch.multinomial(torch.full((64, 50), 1 / 50), 1, generator=next(draw_generators(1))).squeeze(-1)
    assert first.equal(reference)


@pytest.mark.parametrize("temperature", [6.8e-302, 3.4028235677973366e38, 1e308])
def test_extreme_temperatures_sample_without_nan(temperature):
    """A tiny temperature samples the argmax; a huge one any token but those at -inf (the mask)."""
    logits = torch.tensor([[0.0, 5.0, float("-inf"), 1.0]] * 64)
    ids = choose(logits, SamplingParams(temperature=temperature, seed=1), Rng(1))
    if temperature < 1:
        assert ids.tolist() == [1] * 64
    else:
        assert 2 not in ids.tolist() and len(set(ids.tolist())) == 3
