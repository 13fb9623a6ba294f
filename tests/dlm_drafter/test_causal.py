"""Exact KV cache of the causal drafter under topological reordering and out-of-order commits."""

import copy

import torch
from transformers import DynamicCache

from services.common.kv_manager import KVManager
from services.common.models import load_model
from services.common.request import Request
from services.dlm_drafter.causal import CausalDrafter


def uncached_logits(drafter: CausalDrafter, req: Request, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One forward over the whole physical sequence: prompt, commits in commit order, then the window."""
    P = req.prompt_len
    seq = torch.tensor(req.prompt_ids + req.tokens[req.order].tolist() + ids.tolist())[None]
    pos = torch.tensor(list(range(P)) + [P + p for p in req.order] + (positions + P).tolist())[None]
    out = drafter.model(input_ids=seq, position_ids=pos, past_key_values=DynamicCache(), use_cache=True)
    return out.logits[0, -len(ids) :].float()


def forward(drafter: CausalDrafter, req: Request, ids, positions, groups=None) -> torch.Tensor:
    return drafter.forward_batch([(req, ids, positions, groups)])[0][0]


def make_request(loaded, n: int = 16) -> Request:
    return Request("r", [5, 9, 11, 7, 3], n, loaded.mask_id, loaded.eos_id)


def test_window_logits_on_cache_equal_uncached_forward(tiny_zoo):
    loaded = load_model(tiny_zoo["drafter"], reordered=True)
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
    loaded = load_model(tiny_zoo["drafter"], reordered=True)
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
    loaded = load_model(tiny_zoo["drafter"], reordered=True)
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


def test_a_request_resumed_from_an_earlier_round_drops_the_cache_that_ran_past_it(tiny_zoo):
    """Takeover: the drafter holds KV of commits the request's record predates; the request runs again from the
    record (an earlier copy of itself), and its logits are those of the earlier request, not of the cache."""
    loaded = load_model(tiny_zoo["drafter"], reordered=True)
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
