"""Exact KV cache of the causal drafter under topological reordering and out-of-order commits."""

import copy

import pytest
import torch
from transformers import DynamicCache

from services.common.kv_manager import KVManager
from services.common.models import load_model
from services.common.proposal import Region
from services.common.request import Request
from services.common.sampling import SamplingParams
from services.dlm_drafter.causal import CausalDrafter

IDS = ["greedy", "seeded"]


def uncached_logits(drafter: CausalDrafter, req: Request, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One forward over the whole physical sequence: prompt, commits in commit order, then the window."""
    P = req.prompt_len
    seq = torch.tensor(req.prompt_ids + req.tokens[req.order].tolist() + ids.tolist())[None]
    pos = torch.tensor(list(range(P)) + [P + p for p in req.order] + (positions + P).tolist())[None]
    out = drafter.loaded.model(input_ids=seq, position_ids=pos, past_key_values=DynamicCache(), use_cache=True)
    return out.logits[0, -len(ids) :].float()


def forward(drafter: CausalDrafter, req: Request, ids, positions, groups=None) -> torch.Tensor:
    return drafter.forward_batch([(req, ids, positions, groups)])[0][0]


def make_request(loaded, n: int = 16) -> Request:
    return Request("r", [5, 9, 11, 7, 3], n, loaded.mask_id, loaded.eos_id)


def test_window_logits_on_cache_equal_uncached_forward(tiny_zoo):
    loaded = load_model(tiny_zoo["drafter"])
    drafter = CausalDrafter(loaded, KVManager())
    req = make_request(loaded)
    g = torch.Generator().manual_seed(0)
    masks = lambda n: torch.full((n,), loaded.mask_id)  # noqa: E731
    # round 1: prefill + a window of masks
    forward(drafter, req, masks(8), torch.arange(8))
    # a slot ahead of the frontier commits first (out of logical order), then the slot before it
    for slot in (torch.arange(4, 8), torch.arange(0, 4)):
        req.decide(slot, torch.randint(20, 200, (4,), generator=g))
        req.commit(slot.tolist())
        # clean context (a decided, uncommitted token) stands before the masks
        window = torch.tensor([12, 8, 9, 10, 11, 13])
        ids = torch.cat([torch.tensor([77]), masks(5)])
        cached = forward(drafter, req, ids, window)
        expected = uncached_logits(drafter, req, ids, window)
        torch.testing.assert_close(cached, expected, atol=1e-4, rtol=0)
    assert req.physical_to_logical()[req.prompt_len :] == [req.prompt_len + p for p in [4, 5, 6, 7, 0, 1, 2, 3]]
    assert drafter.kv.held()["r"] == req.prompt_len + 8


def test_isolated_spans_equal_separate_forwards(tiny_zoo):
    loaded = load_model(tiny_zoo["drafter"])
    drafter = CausalDrafter(loaded, KVManager())
    req = make_request(loaded)
    forward(drafter, req, torch.full((2,), loaded.mask_id), torch.arange(2))
    spans = [(torch.tensor([31, 40, 41]), torch.arange(0, 3)), (torch.tensor([50, 51, 52]), torch.arange(8, 11))]
    ids, pos = torch.cat([s[0] for s in spans]), torch.cat([s[1] for s in spans])
    joint = forward(drafter, req, ids, pos, groups=torch.tensor([0, 0, 0, 1, 1, 1]))
    for i, (span_ids, span_pos) in enumerate(spans):
        alone = forward(drafter, req, span_ids, span_pos)
        torch.testing.assert_close(joint[3 * i : 3 * i + 3], alone, atol=1e-4, rtol=0)


def test_pending_commits_stand_before_grouped_spans_in_a_packed_batch(tiny_zoo):
    """A packed forward of two requests: one with commits not yet cached (pending) and two isolated spans, one plain.
    Each span sees its request's prompt, every commit in commit order (the pending ones included) and itself, as
    one uncached forward over that physical sequence does; the other request sees only its own."""
    loaded = load_model(tiny_zoo["drafter"])
    drafter = CausalDrafter(loaded, KVManager())
    grouped, plain = make_request(loaded), Request("p", [6, 8, 10], 16, loaded.mask_id, loaded.eos_id)
    forward(drafter, grouped, torch.full((2,), loaded.mask_id), torch.arange(2))  # prompts cached
    forward(drafter, plain, torch.full((2,), loaded.mask_id), torch.arange(2))
    for req, slot, ids in ((grouped, [4, 5, 6, 7], [60, 61, 62, 63]), (plain, [0, 1], [70, 71])):
        req.decide(torch.tensor(slot), torch.tensor(ids))
        req.commit(slot)  # pending: the next forward computes their KV
    spans = [(torch.tensor([31, 40, 41]), torch.arange(0, 3)), (torch.tensor([50, 51]), torch.arange(8, 10))]
    ids, pos = torch.cat([s[0] for s in spans]), torch.cat([s[1] for s in spans])
    window = (torch.tensor([72, loaded.mask_id, loaded.mask_id]), torch.arange(2, 5))
    (joint, _), (alone, _) = drafter.forward_batch(
        [(grouped, ids, pos, torch.tensor([0, 0, 0, 1, 1])), (plain, *window, None)]
    )
    torch.testing.assert_close(joint[:3], uncached_logits(drafter, grouped, *spans[0]), atol=1e-4, rtol=0)
    torch.testing.assert_close(joint[3:], uncached_logits(drafter, grouped, *spans[1]), atol=1e-4, rtol=0)
    torch.testing.assert_close(alone, uncached_logits(drafter, plain, *window), atol=1e-4, rtol=0)


def test_ar_head_drafts_the_first_mask_from_the_clean_token_before_it(tiny_zoo):
    """With ar_head, the first mask's logits are the last commit's output on an uncached forward (the drafter's
    next-token head); the other masks' are their own, as without it. Where the token before the first mask is
    already cached, it runs again for its output."""
    loaded = load_model(tiny_zoo["drafter"])
    req = make_request(loaded)
    req.decide(torch.arange(3), torch.tensor([40, 41, 42]))
    req.commit([0, 1, 2])
    region, masks = Region(3, 9), torch.full((6,), loaded.mask_id)
    uncached = uncached_logits(CausalDrafter(loaded, KVManager()), req, masks, torch.arange(3, 9))
    drafter = CausalDrafter(loaded, KVManager())
    ((head, _),) = drafter.propose_batch([(req, region, True)])
    P = req.prompt_len
    seq = torch.tensor(req.prompt_ids + [40, 41, 42])[None]
    last = drafter.loaded.model(input_ids=seq, position_ids=torch.arange(P + 3)[None]).logits[0, -1].float()
    torch.testing.assert_close(head.logits[0], last, atol=1e-4, rtol=0)
    torch.testing.assert_close(head.logits[1:], uncached[1:], atol=1e-4, rtol=0)
    ((again, tokens),) = drafter.propose_batch([(req, region, True)])  # the commits are cached now
    torch.testing.assert_close(again.logits, head.logits, atol=1e-4, rtol=0)
    assert tokens == 1 + 6  # the last commit runs again, for its output: the KV before it is reused


def test_a_model_that_is_not_a_causal_dlm_is_refused_by_name(tiny_zoo):
    bidirectional = load_model(tiny_zoo["drafter_bidirectional"])
    with pytest.raises(ValueError, match=f"drafter {bidirectional.path} is not a causal DLM"):
        CausalDrafter(bidirectional, KVManager())
    unmasked = load_model(tiny_zoo["drafter"])
    unmasked.meta.mask_id = None
    with pytest.raises(ValueError, match=f"drafter {unmasked.path} has no mask token"):
        CausalDrafter(unmasked, KVManager())


def speculate(drafter: CausalDrafter, req: Request, positions: torch.Tensor, ids: torch.Tensor) -> None:
    """A speculative round (PEARL post-verify): the window taken as accepted, then the next window drafted on the
    drafter's cache of the same request, before the guider has verified it."""
    ahead = make_request(drafter.loaded, req.max_new_tokens)
    ahead.decide(positions, ids)
    ahead.commit(positions.tolist())
    forward(drafter, ahead, torch.full((4,), drafter.loaded.mask_id), positions[-1] + 1 + torch.arange(4))


@pytest.mark.parametrize("accepted", [False, True], ids=["rejected", "accepted"])
def test_a_speculative_windows_kv_is_rolled_back_unless_its_window_was_accepted(tiny_zoo, accepted):
    loaded = load_model(tiny_zoo["drafter"])
    drafter = CausalDrafter(loaded, KVManager())
    req = make_request(loaded)
    forward(drafter, req, torch.full((4,), loaded.mask_id), torch.arange(4))
    drafts = torch.tensor([31, 32, 33, 34])
    speculate(drafter, req, torch.arange(4), drafts)
    assert drafter.kv.held()["r"] == req.prompt_len + 4  # the speculative window's commits are cached
    # the guider keeps the first two drafts and corrects the third, or accepts the window
    kept = drafts if accepted else torch.tensor([31, 32, 90])
    req.decide(torch.arange(len(kept)), kept)
    req.commit(list(range(len(kept))))
    window = torch.arange(len(kept), len(kept) + 4)
    ids = torch.full((4,), loaded.mask_id)
    [(cached, processed)] = drafter.forward_batch([(req, ids, window, None)])
    torch.testing.assert_close(cached, uncached_logits(drafter, req, ids, window), atol=1e-4, rtol=0)
    assert drafter.kv.held()["r"] == req.prompt_len + len(kept)
    assert processed == len(ids) + (0 if accepted else 1)  # an accepted window's KV is kept: only the correction runs


def test_a_request_resumed_from_an_earlier_round_drops_the_cache_that_ran_past_it(tiny_zoo):
    """Takeover: the drafter holds KV of commits the request's record predates; the request runs again from the
    record (an earlier copy of itself), and its logits are those of the earlier request, not of the cache."""
    loaded = load_model(tiny_zoo["drafter"])
    drafter = CausalDrafter(loaded, KVManager())
    req = make_request(loaded)
    masks = torch.full((4,), loaded.mask_id)
    forward(drafter, req, masks, torch.arange(4))
    recorded = copy.deepcopy(req)
    req.decide(torch.arange(0, 4), torch.tensor([21, 22, 23, 24]))
    req.commit([0, 1, 2, 3])
    forward(drafter, req, masks, torch.arange(4, 8))
    resumed = forward(drafter, recorded, masks, torch.arange(4))
    torch.testing.assert_close(resumed, uncached_logits(drafter, recorded, masks, torch.arange(4)), atol=1e-4, rtol=0)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, seed=5)], ids=IDS)
@pytest.mark.parametrize("ar_head", [False, True], ids=["mask-head", "ar-head"])
def test_each_guess_is_the_proposal_of_the_request_with_its_drafts_committed(tiny_zoo, sampling, ar_head):
    """propose_after_batch (overlap's guesses) against its reference: for each count n, propose_batch on a copy of
    the request with the first n drafts committed, on a drafter of its own, drawing from a copy of the same RNG. The
    guesses' forward caches the commits still pending and no draft, so a rejected window leaves no trace."""
    loaded = load_model(tiny_zoo["drafter"])
    drafter = CausalDrafter(loaded, KVManager())
    req = Request("r", [5, 9, 11, 7, 3], 16, loaded.mask_id, loaded.eos_id, sampling=sampling)
    drafter.propose_batch([(req, Region(0, 4), ar_head)])
    req.decide(torch.arange(2), torch.tensor([21, 22]))
    req.commit([0, 1])  # this round's commits: pending in the next forward
    drafts, counts, ends = torch.tensor([31, 32, 33, 34]), (4, 1, 2), (10, 7, 9)
    drawn = req.rng.draws
    [(proposals, draws, _)] = drafter.propose_after_batch([(req, 2, drafts, counts, ends, ar_head)])
    assert drafter.kv.held()["r"] == req.prompt_len + 2
    assert req.rng.draws == drawn and draws == drawn + (not sampling.greedy)  # each guess drew from a copy
    for n, end, proposal in zip(counts, ends, proposals, strict=True):
        ahead = copy.deepcopy(req)
        ahead.decide(torch.arange(2, 2 + n), drafts[:n])
        ahead.commit(list(range(2, 2 + n)))
        [(expected, _)] = CausalDrafter(loaded, KVManager()).propose_batch([(ahead, Region(2 + n, end), ar_head)])
        assert torch.equal(proposal.positions, torch.arange(2 + n, end))
        assert torch.equal(proposal.positions, expected.positions) and torch.equal(proposal.ids, expected.ids)
        torch.testing.assert_close(proposal.probs, expected.probs, atol=1e-4, rtol=0)
        assert ahead.rng.draws == draws
    # the round accepts one draft and the guider's token after it: the next window, on the cache, is an uncached
    # forward's (the 1e-4), as if nothing had been drafted
    req.decide(torch.arange(2, 4), torch.tensor([31, 90]))
    req.commit([2, 3])
    ids, window = torch.full((4,), loaded.mask_id), torch.arange(4, 8)
    expected = uncached_logits(drafter, req, ids, window)
    torch.testing.assert_close(forward(drafter, req, ids, window), expected, atol=1e-4, rtol=0)
