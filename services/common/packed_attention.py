"""Attention for packed forwards: each request's queries against its own cache and new keys only.

A packed forward (batch.py) puts every request's new tokens one after another in one row and runs the model without
a cache. Here, in each attention layer, each request's new keys and values follow its own cached ones, its queries
attend to those through its own mask, and its cache takes the new tokens it keeps: the attention layer writes the
cache, as a paged-attention backend does. One SDPA over the whole row with a block-diagonal mask would compute B^2
blocks to keep B of them; packing every request's cache into one row and back cost a copy of each per layer.
Forwards without segments (one request, training) run transformers' SDPA unchanged.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from services.common.kv import layer_kv, set_layer

PACKED_SDPA = "packed_sdpa"


@dataclass(frozen=True, slots=True)
class Segment:
    cache: DynamicCache  # the request's past; takes the KV of its first `keep` new tokens
    new: slice  # its queries, keys and values in the packed row
    mask: torch.Tensor  # [q_i, L_i + q_i] bool, True = attend
    keep: int
    rest: DynamicCache | None = None  # where given, takes the KV of its new tokens past keep


def extend(seg: Segment, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """key, value [1, H_kv, q_i, D], the segment's new tokens' -> [1, H_kv, L_i + q_i, D] after its cached ones.
    The caches keep views of the result: the next forward's concatenation copies them anyway."""
    past = layer_kv(seg.cache, layer)
    if past is not None:
        key, value = torch.cat([past[0], key], dim=2), torch.cat([past[1], value], dim=2)
    end = key.shape[2] - (seg.new.stop - seg.new.start) + seg.keep
    set_layer(seg.cache, layer, key[:, :, :end], value[:, :, :end])
    if seg.rest is not None:
        set_layer(seg.rest, layer, key[:, :, end:], value[:, :, end:])
    return key, value


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
    """query [1, H, Q, D]; key, value [1, H_kv, Q, D], the new tokens' -> [1, Q, H, D], as transformers' attention
    returns."""
    if segments is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    outputs = []
    for seg in segments:
        k, v = extend(seg, module.layer_idx, key[:, :, seg.new], value[:, :, seg.new])
        outputs.append(
            F.scaled_dot_product_attention(
                query[:, :, seg.new], k, v, attn_mask=seg.mask, scale=scaling, enable_gqa=True
            )
        )
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa)
AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)  # masks of unpacked forwards: as for SDPA
