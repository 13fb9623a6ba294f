"""A padded batch over requests with different cache lengths equals their forwards one by one."""

import torch
from transformers import DynamicCache

from services.ar_guider.guider import Guider
from services.common.batch import Item, forward
from services.common.kv_manager import KVManager
from services.common.models import load_model
from services.common.proposal import Region
from services.common.request import Request
from services.dlm_drafter.causal import CausalDrafter
from tests.scripted import ScriptedLM, cached_tokens


def requests(loaded, tag: str) -> list[Request]:
    reqs = [
        Request(f"{tag}a", [5, 9, 11], 12, loaded.mask_id, loaded.eos_id),
        Request(f"{tag}b", [5, 9, 11, 7, 3, 22, 40], 12, loaded.mask_id, loaded.eos_id),
    ]
    reqs[1].decide(torch.arange(4, 7), torch.tensor([50, 51, 52]))  # out-of-order slot
    reqs[1].commit([4, 5, 6])
    return reqs


def test_drafter_batch_equals_single_forwards(tiny_zoo):
    kv = KVManager()
    drafter = CausalDrafter(load_model(tiny_zoo["drafter"]), kv)
    single, batched = requests(drafter.loaded, "s"), requests(drafter.loaded, "b")
    for round_ in range(3):
        regions = [Region(0, 6), Region(0, 4)]
        heads = [round_ % 2 == 0, True]  # the first mask from the clean token before it, or from itself
        alone = [drafter.propose_batch([call])[0][0] for call in zip(single, regions, heads, strict=True)]
        together = [p for p, _ in drafter.propose_batch(list(zip(batched, regions, heads, strict=True)))]
        for a, b in zip(alone, together, strict=True):
            torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=0)
            assert torch.equal(a.positions, b.positions) and torch.equal(a.ids, b.ids)
        for reqs in (single, batched):  # commit the first proposal so caches grow unevenly
            reqs[round_ % 2].decide(alone[round_ % 2].positions[:1], alone[round_ % 2].ids[:1])
            reqs[round_ % 2].commit(alone[round_ % 2].positions[:1].tolist())
    for s, b in zip(single, batched, strict=True):
        assert kv.held()[s.id] == kv.held()[b.id]


def test_guider_batch_equals_single_forwards(tiny_zoo):
    guider = Guider(load_model(tiny_zoo["guider"]), KVManager())
    single, batched = requests(guider.loaded, "s"), requests(guider.loaded, "b")
    drafts = [torch.tensor([60, 61, 62]), torch.tensor([70])]
    for s, b in zip(single, batched, strict=True):
        s.decide(torch.arange(2), torch.tensor([8, 9]))
        b.decide(torch.arange(2), torch.tensor([8, 9]))
    alone = [guider.verify_batch([(r, 2, d, 3)])[0] for r, d in zip(single, drafts, strict=True)]
    together = guider.verify_batch([(r, 2, d, 3) for r, d in zip(batched, drafts, strict=True)])
    for a, b in zip(alone, together, strict=True):
        torch.testing.assert_close(a.draft_probs, b.draft_probs, atol=1e-5, rtol=0)
        assert torch.equal(a.target, b.target) and torch.equal(a.topk, b.topk)


def test_a_packed_forward_keeps_each_items_first_keep_tokens_and_hands_it_the_rest():
    """Per item, among every other item's new tokens: the KV of its first `keep` new tokens joins its cache, and that
    of the new tokens past `keep` goes to `rest` (the staged KV of slot reuse, 000 §4.2)."""
    past = DynamicCache()
    past.update(torch.tensor([3.0, 4.0])[None, None, :, None], torch.tensor([0.0, 1.0])[None, None, :, None], 0)
    items = [
        Item(DynamicCache(), [5, 6, 7, 8], [0, 1, 2, 3], keep=1, rest=DynamicCache()),
        Item(past, [9, 10, 11], [2, 3, 4], keep=2, rest=DynamicCache()),
    ]
    forward(ScriptedLM({}, prompt_len=0), items)
    assert [cached_tokens(item.cache) for item in items] == [[5], [3, 4, 9, 10]]
    assert [cached_tokens(item.rest) for item in items] == [[6, 7, 8], [11]]
