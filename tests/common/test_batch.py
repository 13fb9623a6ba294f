"""A padded batch over requests with different cache lengths equals their forwards one by one."""

import torch

from services.ar_guider.guider import Guider
from services.common.kv_manager import KVManager
from services.common.models import load_model
from services.common.proposal import Region
from services.common.request import Request
from services.dlm_drafter.causal import CausalDrafter


def requests(loaded, tag: str) -> list[Request]:
    reqs = [
        Request(f"{tag}a", [5, 9, 11], 12, loaded.mask_id, loaded.eos_id),
        Request(f"{tag}b", [5, 9, 11, 7, 3, 22, 40], 12, loaded.mask_id, loaded.eos_id),
    ]
    reqs[1].decide(torch.arange(4, 7), torch.tensor([50, 51, 52]))  # out-of-order slot
    reqs[1].commit([4, 5, 6])
    return reqs


def test_drafter_batch_equals_single_forwards(tiny_zoo):
    kv = KVManager(10**6)
    drafter = CausalDrafter(load_model(tiny_zoo["drafter"], reordered=True), kv)
    single, batched = requests(drafter.loaded, "s"), requests(drafter.loaded, "b")
    for round_ in range(3):
        regions = [Region(0, 6), Region(0, 4)]
        alone = [drafter.propose_batch([(r, g)])[0][0] for r, g in zip(single, regions, strict=True)]
        together = [p for p, _ in drafter.propose_batch(list(zip(batched, regions, strict=True)))]
        for a, b in zip(alone, together, strict=True):
            torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=0)
            assert torch.equal(a.positions, b.positions) and torch.equal(a.ids, b.ids)
        for reqs in (single, batched):  # commit the first proposal so caches grow unevenly
            reqs[round_ % 2].decide(alone[round_ % 2].positions[:1], alone[round_ % 2].ids[:1])
            reqs[round_ % 2].commit(alone[round_ % 2].positions[:1].tolist())
    for s, b in zip(single, batched, strict=True):
        assert kv.held()[s.id] == kv.held()[b.id]


def test_guider_batch_equals_single_forwards(tiny_zoo):
    guider = Guider(load_model(tiny_zoo["guider"]), KVManager(10**6))
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
