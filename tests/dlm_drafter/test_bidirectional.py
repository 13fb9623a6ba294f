"""Bidirectional drafter: cache modes over the same block agree with a full forward where inputs are unchanged."""

import pytest
import torch

from services.common.models import load_model
from services.common.proposal import Region
from services.common.request import Request
from services.dlm_drafter.bidirectional import BidirectionalDrafter, Smoothing


@pytest.mark.parametrize("cache", ["prefix", "dual", "freecache"])
def test_cached_block_forward_matches_full_forward(tiny_zoo, cache):
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    assert loaded.bidirectional
    full, cached = BidirectionalDrafter(loaded, "none"), BidirectionalDrafter(loaded, cache)
    req = Request("r", [5, 9, 11, 7], 24, loaded.mask_id, loaded.eos_id)
    req.decide(torch.arange(8), torch.arange(30, 38))
    region = Region(8, 16)
    first = cached.propose(req, region)  # a full forward that fills the cache
    again = cached.propose(req, region)  # nothing changed: the cached forward must agree
    reference = full.propose(req, region)
    torch.testing.assert_close(first.logits, reference.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(again.logits, reference.logits, atol=1e-4, rtol=0)


def test_bidirectional_attention_sees_the_future(tiny_zoo):
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    drafter = BidirectionalDrafter(loaded)
    req = Request("r", [5, 9, 11, 7], 8, loaded.mask_id, loaded.eos_id)
    before = drafter.propose(req, Region(0, 4)).logits
    req.decide(torch.tensor([7]), torch.tensor([42]))  # a later token changes earlier predictions
    after = drafter.propose(req, Region(0, 4)).logits
    assert not torch.allclose(before, after)


def test_iteration_smoothing_changes_masked_inputs(tiny_zoo):
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    plain, smooth = BidirectionalDrafter(loaded), BidirectionalDrafter(loaded, smoothing=Smoothing())
    req = Request("r", [5, 9, 11, 7], 8, loaded.mask_id, loaded.eos_id)
    region = Region(0, 8)
    torch.testing.assert_close(plain.propose(req, region).logits, smooth.propose(req, region).logits)
    assert not torch.allclose(plain.propose(req, region).logits, smooth.propose(req, region).logits)


def test_iteration_smoothing_survives_an_eos_cutting_the_block(tiny_zoo):
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    drafter = BidirectionalDrafter(loaded, smoothing=Smoothing())
    req = Request("r", [5, 9, 11, 7], 8, loaded.mask_id, loaded.eos_id)
    drafter.propose(req, Region(0, 8))
    req.decide(torch.tensor([5]), torch.tensor([loaded.eos_id]))  # horizon 8 -> 6
    proposal = drafter.propose(req, Region(0, req.horizon))
    assert proposal.positions.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_forward_in_a_new_block_matches_full_forward(tiny_zoo, cache):
    """Fast-dLLM refreshes the cache at every block: block 2 never attends to KV computed while block 1 was masked.
    (FreeCache keeps earlier blocks' KV frozen by design, so it is not exact here.)"""
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    full, cached = BidirectionalDrafter(loaded, "none"), BidirectionalDrafter(loaded, cache)
    req = Request("r", [5, 9, 11, 7], 24, loaded.mask_id, loaded.eos_id)
    cached.propose(req, Region(0, 8))
    req.decide(torch.arange(8), torch.arange(30, 38))
    for _ in range(2):
        torch.testing.assert_close(
            cached.propose(req, Region(8, 16)).logits, full.propose(req, Region(8, 16)).logits, atol=1e-4, rtol=0
        )


def test_no_cache_mode_keeps_no_kv(tiny_zoo):
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    drafter = BidirectionalDrafter(loaded, "none")
    req = Request("r", [5, 9, 11, 7], 8, loaded.mask_id, loaded.eos_id)
    first = drafter.propose(req, Region(0, 8)).logits
    assert drafter.caches["r"].kv.get_seq_length() == 0
    torch.testing.assert_close(drafter.propose(req, Region(0, 8)).logits, first)
    drafter.release("r")
    assert "r" not in drafter.caches


def test_smoothing_weight_grows_to_its_cap():
    smoothing = Smoothing()
    assert [round(smoothing.alpha(step), 6) for step in (0, 1, 2, 4, 10)] == [0.1, 0.15, 0.2, 0.3, 0.3]
