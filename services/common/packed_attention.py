"""Attention for packed forwards: each request's queries against its own keys only.

A packed forward (batch.py) puts every request's past, then every request's new tokens, in one row. One SDPA over
all Q queries and L + Q keys with a block-diagonal mask computes B^2 blocks to keep B of them; at 16 requests the
attention cost 16x what it needs. Here each request gets its own SDPA over its past and its new tokens. Forwards
without segments (one request, training) run transformers' SDPA unchanged.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_SDPA = "packed_sdpa"


@dataclass(frozen=True, slots=True)
class Segment:
    past: slice  # its keys in the packed past
    new: slice  # its queries, and their keys after the packed past
    mask: torch.Tensor  # [q_i, L_i + q_i] bool, True = attend


def packed_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    segments: list[Segment] | None = None,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [1, H, Q, D]; key, value [1, H_kv, L + Q, D] -> [1, Q, H, D], as transformers' attention returns."""
    if segments is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    past = key.shape[2] - query.shape[2]
    outputs = []
    for seg in segments:
        new = slice(past + seg.new.start, past + seg.new.stop)
        k = torch.cat([key[:, :, seg.past], key[:, :, new]], dim=2)
        v = torch.cat([value[:, :, seg.past], value[:, :, new]], dim=2)
        outputs.append(F.scaled_dot_product_attention(query[:, :, seg.new], k, v, attn_mask=seg.mask, scale=scaling))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa)
AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)  # masks of unpacked forwards: as for SDPA
