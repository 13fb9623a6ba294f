"""Per-request attention over a packed row equals one SDPA over every request's past and new keys with the
block-diagonal mask, and each request's cache takes the KV of the new tokens it keeps, its rest the others'. SDPA gets
the KV heads grouped, except on a device whose fused kernels need them expanded (CUDA)."""

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from services.common import packed_attention
from services.common.packed_attention import Segment, attend

HEADS, KV_HEADS, DIM = 4, 2, 8


def reference(query, key, value, pasts, sizes, masks) -> torch.Tensor:
    """The packed row's attention as one SDPA over [every past, every new key]: request i's queries see its past and
    its new keys through its mask, nothing of any other request. query [1, H, Q, D], key, value [1, H_kv, Q, D]
    -> [Q, H * D]."""
    past_total, q = sum(p.shape[2] for p in pasts[0]), sum(sizes)
    full = torch.zeros(q, past_total + q, dtype=torch.bool)
    row, col = 0, 0
    for past, n, mask in zip(pasts[0], sizes, masks, strict=True):
        length = past.shape[2]
        full[row : row + n, col : col + length] = mask[:, :length]
        full[row : row + n, past_total + row : past_total + row + n] = mask[:, length:]
        row, col = row + n, col + length
    groups = HEADS // KV_HEADS
    k = torch.cat([*pasts[0], key], dim=2).repeat_interleave(groups, dim=1)
    v = torch.cat([*pasts[1], value], dim=2).repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(query, k, v, attn_mask=full)[0].transpose(0, 1).flatten(1)


@pytest.mark.parametrize("expanded", [False, True], ids=["cpu", "cpu-as-cuda"])
def test_each_request_attends_to_its_own_past_and_new_tokens_only_and_keeps_its_first_keep(expanded, monkeypatch):
    if expanded:
        monkeypatch.setattr(packed_attention, "EXPAND_KV_HEADS_ON", frozenset({"cpu"}))
    sdpa_calls = []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        sdpa_calls.append((k.shape[1], v.shape[1], kwargs.get("enable_gqa", False)))
        return original(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    lengths, sizes, keeps = [5, 0, 9], [3, 4, 2], [1, 4, 0]  # a request without a past among them
    past_keys = [torch.randn(1, KV_HEADS, n, DIM) for n in lengths]
    past_values = [torch.randn(1, KV_HEADS, n, DIM) for n in lengths]
    masks = [  # its past, and its new tokens at random, each seeing at least itself
        torch.cat([torch.ones(n, p, dtype=torch.bool), (torch.rand(n, n) > 0.4) | torch.eye(n, dtype=torch.bool)], 1)
        for p, n in zip(lengths, sizes, strict=True)
    ]
    segments, row = [], 0
    for k, v, n, mask, keep in zip(past_keys, past_values, sizes, masks, keeps, strict=True):
        cache = DynamicCache()
        if k.shape[2]:
            cache.update(k, v, 0)
        scores = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))  # added to the scores
        segments.append(Segment(cache, slice(row, row + n), scores, keep, DynamicCache()))
        row += n
    query = torch.randn(row, HEADS, DIM)
    key, value = torch.randn(row, KV_HEADS, DIM), torch.randn(row, KV_HEADS, DIM)
    out = attend(query, key, value, segments, 0, DIM**-0.5)
    kv_heads = HEADS if expanded else KV_HEADS
    assert sdpa_calls == [(kv_heads, kv_heads, not expanded)] * len(segments)
    heads_first = [t.transpose(0, 1)[None] for t in (query, key, value)]
    torch.testing.assert_close(out, reference(*heads_first, (past_keys, past_values), sizes, masks), atol=1e-6, rtol=0)
    for seg, past, keep in zip(segments, past_keys, keeps, strict=True):
        new = heads_first[1][:, :, seg.new]
        assert torch.equal(seg.cache.layers[0].keys, torch.cat([past, new[:, :, :keep]], dim=2))
        assert torch.equal(seg.rest.layers[0].keys, new[:, :, keep:])
