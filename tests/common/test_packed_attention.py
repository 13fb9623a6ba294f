"""Per-request attention over a packed row equals one SDPA over the row with the block-diagonal mask."""

import torch
import torch.nn.functional as F
from torch import nn

from services.common.packed_attention import Segment, packed_sdpa

HEADS, KV_HEADS, DIM = 4, 2, 8


def reference(query, key, value, pasts, sizes, masks) -> torch.Tensor:
    """The packed row's attention as one SDPA: request i's queries see its past and its new keys through its mask,
    nothing of any other request -> [1, Q, H, D]."""
    past_total, q = sum(pasts), sum(sizes)
    full = torch.zeros(q, past_total + q, dtype=torch.bool)
    row, col = 0, 0
    for past, n, mask in zip(pasts, sizes, masks, strict=True):
        full[row : row + n, col : col + past] = mask[:, :past]
        full[row : row + n, past_total + row : past_total + row + n] = mask[:, past:]
        row, col = row + n, col + past
    groups = HEADS // KV_HEADS
    k, v = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(query, k, v, attn_mask=full).transpose(1, 2)


def test_each_request_attends_to_its_own_past_and_new_tokens_only():
    torch.manual_seed(0)
    pasts, sizes = [5, 0, 9], [3, 4, 2]  # a request without a past among them
    masks = [  # its past, and its new tokens at random, each seeing at least itself
        torch.cat([torch.ones(n, p, dtype=torch.bool), (torch.rand(n, n) > 0.4) | torch.eye(n, dtype=torch.bool)], 1)
        for p, n in zip(pasts, sizes, strict=True)
    ]
    segments, row, col = [], 0, 0
    for past, n, mask in zip(pasts, sizes, masks, strict=True):
        segments.append(Segment(slice(col, col + past), slice(row, row + n), mask))
        row, col = row + n, col + past
    q, keys = sum(sizes), sum(pasts) + sum(sizes)
    query = torch.randn(1, HEADS, q, DIM)
    key, value = torch.randn(1, KV_HEADS, keys, DIM), torch.randn(1, KV_HEADS, keys, DIM)
    out, _ = packed_sdpa(nn.Module(), query, key, value, None, segments=segments)
    torch.testing.assert_close(out, reference(query, key, value, pasts, sizes, masks), atol=1e-6, rtol=0)
