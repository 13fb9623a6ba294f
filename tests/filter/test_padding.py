"""The Learn2PD filter pads a short block as its training rows do (decided = 1.0), on each shipped filter."""

import pytest
import torch

from services.filter.model import Learn2PDFilter

WINDOW = 16  # pipeline's default window: half of the shipped filter's 32-position block is padding


@pytest.fixture(scope="module", params=["models/filter-causal", "models/filter-bidirectional"])
def shipped(request) -> Learn2PDFilter:
    return Learn2PDFilter.load(request.param)


def training_row(window: torch.Tensor, block_size: int) -> torch.Tensor:
    """A row as services/training/filter.py records it: every position outside the masked ones reads 1.0."""
    row = torch.ones(block_size)
    row[: len(window)] = window
    return row


def test_half_filled_block_scores_as_the_training_padded_block(shipped):
    window = torch.linspace(0.3, 0.99, WINDOW)
    expected = torch.sigmoid(shipped(training_row(window, shipped.config.block_size)[None]))[0, :WINDOW]
    torch.testing.assert_close(shipped.accept_probs(window), expected.detach())
    assert shipped.accept_probs_batch([window, window[:3]])[1].shape == (3,)


@pytest.mark.parametrize("position", range(WINDOW))
def test_an_uncertain_token_in_a_decided_window_is_not_accepted(position):
    """With zeros as padding the shipped filter gave a 0.5-confidence token at the window's first position 0.997.
    On the bidirectional drafter's filter, whose acceptance decides learn2pd's output. (The causal drafter's filter
    learned from its EGP rows that a lone frontier draft with everything after it decided is mostly right: it scores
    one at 0.5 about 0.96; in the pipeline the guider decides the frontier, the filter only the drafts past it.)"""
    shipped = Learn2PDFilter.load("models/filter-bidirectional")
    window = torch.ones(WINDOW)
    window[position] = 0.5
    assert shipped.accept_probs(window)[position] < shipped.config.threshold
