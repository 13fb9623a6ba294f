"""Bidirectional drafter: cache modes over the same block agree with a full forward where inputs are unchanged, a
padded batch over requests (any mix of cache modes, smoothing, prompts, blocks) equals their proposals one by one, and
vicinity refresh recomputes exactly the positions dInfer's description says."""

import copy
from dataclasses import dataclass, replace

import pytest
import torch
from transformers import DynamicCache

from services.common.contract import ProposeBidirectional
from services.common.kv import cache_len
from services.common.models import LoadedModel, load_model
from services.common.proposal import Proposal, Region
from services.common.request import Request
from services.dlm_drafter.bidirectional import (
    CACHE_MODES,
    BidirectionalCall,
    BidirectionalDrafter,
    BlockCache,
    Smoothing,
    Vicinity,
)
from services.dlm_drafter.host import DrafterHost


class Serial:
    """One request at a time through the drafter host, as a propose stage calls it; counts what the engine counts."""

    def __init__(self, loaded: LoadedModel, cache: str, smoothing: Smoothing | None, vicinity: Vicinity):
        self.host = DrafterHost(None, loaded)
        self.cache, self.smoothing, self.vicinity = cache, smoothing, vicinity

    def propose(self, req: Request, region: Region) -> Proposal:
        args = ProposeBidirectional(req, region, self.cache, self.vicinity, self.smoothing, keep_logits=True)
        reply = self.host.propose_bidirectional([args])[0]
        req.stats.drafter_forwards += 1
        req.stats.drafter_tokens_processed += reply.tokens
        return reply.value


def serial(
    loaded: LoadedModel, cache: str = "none", smoothing: Smoothing | None = None, vicinity: Vicinity | None = None
) -> Serial:
    return Serial(loaded, cache, smoothing, vicinity or Vicinity())


@pytest.mark.parametrize("cache", ["prefix", "dual", "freecache", "vicinity"])
def test_cached_block_forward_matches_full_forward(tiny_zoo, cache):
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    assert loaded.bidirectional
    full, cached = serial(loaded, "none"), serial(loaded, cache, vicinity=Vicinity(2, 3, 0))
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
    drafter = serial(loaded)
    req = Request("r", [5, 9, 11, 7], 8, loaded.mask_id, loaded.eos_id)
    before = drafter.propose(req, Region(0, 4)).logits
    req.decide(torch.tensor([7]), torch.tensor([42]))  # a later token changes earlier predictions
    after = drafter.propose(req, Region(0, 4)).logits
    assert not torch.allclose(before, after)


def test_iteration_smoothing_changes_masked_inputs(tiny_zoo):
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    plain, smooth = serial(loaded), serial(loaded, smoothing=Smoothing())
    req = Request("r", [5, 9, 11, 7], 8, loaded.mask_id, loaded.eos_id)
    region = Region(0, 8)
    torch.testing.assert_close(plain.propose(req, region).logits, smooth.propose(req, region).logits)
    assert not torch.allclose(plain.propose(req, region).logits, smooth.propose(req, region).logits)


def test_iteration_smoothing_survives_an_eos_cutting_the_block(tiny_zoo):
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    drafter = serial(loaded, smoothing=Smoothing())
    req = Request("r", [5, 9, 11, 7], 8, loaded.mask_id, loaded.eos_id)
    drafter.propose(req, Region(0, 8))
    req.decide(torch.tensor([5]), torch.tensor([loaded.eos_id]))
    req.horizon = req.end  # EOS truncation: 8 -> 6
    proposal = drafter.propose(req, Region(0, req.horizon))
    assert proposal.positions.tolist() == [0, 1, 2, 3, 4]


def test_host_counts_tokens_past_the_prompt(tiny_zoo):
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    drafter = serial(loaded, "dual")
    req = Request("r", [5, 9, 11, 7], 16, loaded.mask_id, loaded.eos_id)
    drafter.propose(req, Region(0, 8))  # full forward: 4 + 16, the prompt not counted
    drafter.propose(req, Region(0, 8))  # the block alone
    assert (req.stats.drafter_forwards, req.stats.drafter_tokens_processed) == (2, 16 + 8)


# --- batched == one by one ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Spec:
    prompt: list[int]
    block: int
    cache: str
    smoothing: bool
    decided: tuple[int, ...] = ()  # positions decided before the first round


PROMPTS = [[5, 9, 11], [5, 9, 11, 7, 3], [40, 41, 42, 43, 44, 45, 46, 47], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
BLOCKS = [4, 6, 8, 4]
VICINITY = Vicinity(prefix_look=2, after_look=3, warmup_times=1)  # windows smaller than these short sequences


def specs_for(modes: list[str]) -> list[Spec]:
    """Each mode with smoothing off and on, over different prompts and block sizes; some slots decided ahead."""
    return [
        Spec(PROMPTS[i % 4], BLOCKS[(i + i // 4) % 4], mode, smoothing, (9,) if i % 3 == 0 else ())
        for i, (mode, smoothing) in enumerate((m, s) for m in modes for s in (False, True))
    ]


def region_of(req: Request, block: int) -> Region | None:
    """The block holding the frontier; None once the request is done."""
    if req.frontier >= req.horizon:
        return None
    start = req.frontier // block * block
    return Region(start, min(start + block, req.horizon))


def decode(loaded: LoadedModel, specs: list[Spec], batched: bool, rounds: int = 7):
    """Every round: propose for every live request (one batch, or one call each), then decide the first and the last
    proposed position, so blocks finish in 1-4 rounds and requests enter new blocks at different rounds."""
    drafter = BidirectionalDrafter(loaded)
    reqs = [Request(f"r{i}", s.prompt, 20, loaded.mask_id, loaded.eos_id) for i, s in enumerate(specs)]
    for req, spec in zip(reqs, specs, strict=True):
        if spec.decided:
            req.decide(torch.tensor(spec.decided), torch.full((len(spec.decided),), 50))
    states = [BlockCache(DynamicCache()) for _ in specs]
    history: list[list[tuple[Proposal, int]]] = []
    for _ in range(rounds):
        calls = []
        for req, spec, state in zip(reqs, specs, states, strict=True):
            region = region_of(req, spec.block)
            if region is not None:
                smoothing = Smoothing() if spec.smoothing else None
                calls.append(BidirectionalCall(req, region, state, spec.cache, smoothing, VICINITY))
        results = drafter.propose_batch(calls) if batched else [drafter.propose_batch([c])[0] for c in calls]
        history.append(results)
        for call, (proposal, _) in zip(calls, results, strict=True):
            pick = torch.tensor([0, len(proposal.positions) - 1]).unique()
            call.req.decide(proposal.positions[pick], proposal.ids[pick])
    return history, states


def assert_batch_equals_one_by_one(loaded: LoadedModel, specs: list[Spec]) -> None:
    batched, batched_states = decode(loaded, specs, batched=True)
    alone, alone_states = decode(loaded, specs, batched=False)
    for round_, (together, single) in enumerate(zip(batched, alone, strict=True)):
        assert len(together) == len(single) > 1, f"round {round_}: nothing left to batch"
        for (b, b_tokens), (a, a_tokens) in zip(together, single, strict=True):
            torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=0)
            assert torch.equal(b.positions, a.positions) and torch.equal(b.ids, a.ids)
            assert b_tokens == a_tokens
    for b, a in zip(batched_states, alone_states, strict=True):
        assert (cache_len(b.kv), b.block_start, b.frozen, b.step) == (cache_len(a.kv), a.block_start, a.frozen, a.step)
        assert b.forwards == a.forwards


@pytest.mark.parametrize("cache", CACHE_MODES)
def test_batch_equals_one_by_one_per_cache_mode(tiny_zoo, cache):
    assert_batch_equals_one_by_one(load_model(tiny_zoo["drafter_bidirectional"]), specs_for([cache, cache]))


@pytest.mark.parametrize("shift", [0, 1])
def test_batch_mixing_cache_modes_and_smoothing_equals_one_by_one(tiny_zoo, shift):
    """shift 1: the same weights read Dream-style (a block's logits come from the outputs one position earlier)."""
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    loaded = replace(loaded, meta=replace(loaded.meta, logits_shift=shift))
    assert_batch_equals_one_by_one(loaded, specs_for(list(CACHE_MODES)))


def test_decode_scenario_covers_block_changes_and_uneven_caches(tiny_zoo):
    """The scenario the batch tests run on must move blocks mid-way and give rows different past lengths."""
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    specs = specs_for(list(CACHE_MODES))
    history, states = decode(loaded, specs, batched=True)
    assert all(state.block_start > 0 for state in states)  # every request entered a new block
    assert len({cache_len(state.kv) for state in states}) > 3  # past caches of many lengths: padding in the batch
    assert any(state.frozen > 0 for state, spec in zip(states, specs, strict=True) if spec.cache == "freecache")
    for state, spec in zip(states, specs, strict=True):
        if spec.cache == "vicinity":  # past its warm-up: the cache holds the sequence less the window around the block
            assert state.forwards > VICINITY.warmup_times and 0 < cache_len(state.kv) < len(spec.prompt) + 20


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_forward_in_a_new_block_matches_full_forward(tiny_zoo, cache):
    """Fast-dLLM refreshes the cache at every block: block 2 never attends to KV computed while block 1 was masked.
    (FreeCache keeps earlier blocks' KV frozen by design, so it is not exact here.)"""
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    full, cached = serial(loaded, "none"), serial(loaded, cache)
    req = Request("r", [5, 9, 11, 7], 24, loaded.mask_id, loaded.eos_id)
    cached.propose(req, Region(0, 8))
    req.decide(torch.arange(8), torch.arange(30, 38))
    for _ in range(2):
        torch.testing.assert_close(
            cached.propose(req, Region(8, 16)).logits, full.propose(req, Region(8, 16)).logits, atol=1e-4, rtol=0
        )


def test_no_cache_mode_keeps_no_kv(tiny_zoo):
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    drafter = serial(loaded, "none")
    req = Request("r", [5, 9, 11, 7], 8, loaded.mask_id, loaded.eos_id)
    first = drafter.propose(req, Region(0, 8)).logits
    assert drafter.host.held()["r"] == 0
    torch.testing.assert_close(drafter.propose(req, Region(0, 8)).logits, first)
    drafter.host.release(["r"])
    assert "r" not in drafter.host.held()


def test_smoothing_weight_grows_to_its_cap():
    smoothing = Smoothing()
    assert [round(smoothing.alpha(step), 6) for step in (0, 1, 2, 4, 10)] == [0.1, 0.15, 0.2, 0.3, 0.3]


def test_a_request_resumed_from_an_earlier_block_drops_the_frozen_cache_past_it(tiny_zoo):
    """Takeover: the replica's cache froze blocks past the request's record; the request runs again from the record
    (an earlier copy of itself, in an earlier block) and proposes what a cache that never ran ahead proposes."""
    loaded = load_model(tiny_zoo["drafter_bidirectional"])
    ahead, fresh = serial(loaded, "freecache"), serial(loaded, "freecache")
    req = Request("r", [5, 9, 11, 7], 24, loaded.mask_id, loaded.eos_id)
    req.decide(torch.arange(4), torch.arange(30, 34))
    recorded = copy.deepcopy(req)
    for target in (ahead, fresh):
        target.propose(copy.deepcopy(recorded), Region(0, 8))
    req.decide(torch.arange(4, 16), torch.arange(34, 46))  # blocks 0 and 1 done: block 2's forward freezes them
    ahead.propose(req, Region(16, 24))
    assert cache_len(ahead.host.kv.caches["r"].kv) > 4 + 8
    resumed = ahead.propose(copy.deepcopy(recorded), Region(0, 8))
    torch.testing.assert_close(resumed.logits, fresh.propose(copy.deepcopy(recorded), Region(0, 8)).logits)
