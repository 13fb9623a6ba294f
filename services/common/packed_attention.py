"""Attention for packed forwards: each request's queries against its own cache and new keys only.

A packed forward (batch.py) puts every request's new tokens one after another in one row. Here, in each attention
layer, each request's new keys and values follow its own cached ones, its queries attend to those through its own
mask, and its cache takes the new tokens it keeps: the attention layer writes the cache, as a paged-attention backend
does. One SDPA over the whole row with a block-diagonal mask would compute B^2 blocks to keep B of them; packing
every request's cache into one row and back cost a copy of each per layer.

On CUDA, SDPA's fused kernels each refuse part of what a segment asks: flash attention takes no mask and no float32,
the memory-efficient kernel no grouped-query heads. SDPA then falls back to its math path (a matmul, the mask, a
softmax, a matmul: several launches, a third of a GPU propose's CPU time). So there each segment's KV heads are
expanded and the memory-efficient kernel takes it; on the CPU, SDPA's grouped-query heads copy nothing.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from services.common.kv import layer_kv, set_layer

EXPAND_KV_HEADS_ON = frozenset({"cuda"})  # device types whose SDPA runs fused only without grouped-query heads


@dataclass(frozen=True, slots=True)
class Segment:
    cache: DynamicCache  # the request's past; takes the KV of its first `keep` new tokens
    new: slice  # its queries, keys and values in the packed row
    mask: torch.Tensor | None  # [q_i, L_i + q_i] added to the scores: 0 = attend, -inf = not; None: as `causal` says
    keep: int
    rest: DynamicCache | None = None  # where given, takes the KV of its new tokens past keep
    causal: bool = False  # without a mask: causal over its new tokens (no past), else every key seen


def extend(seg: Segment, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """key, value [1, H_kv, q_i, D], the segment's new tokens' -> [1, H_kv, L_i + q_i, D] after its cached ones.
    The caches keep views of the result: the next forward's concatenation copies them anyway."""
    past = layer_kv(seg.cache, layer)
    if past is not None:
        key, value = torch.cat([past[0], key], dim=2), torch.cat([past[1], value], dim=2)
    keep(seg, layer, key, value)
    return key, value


def keep(seg: Segment, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
    """key, value [1, H_kv, L_i + q_i, D], the segment's past and new entries: its cache takes the past and the first
    keep new ones, its rest the others."""
    end = key.shape[2] - (seg.new.stop - seg.new.start) + seg.keep
    set_layer(seg.cache, layer, key[:, :, :end], value[:, :, :end])
    if seg.rest is not None:
        set_layer(seg.rest, layer, key[:, :, end:], value[:, :, end:])


def attend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, segments: list[Segment], layer: int, scale: float
) -> torch.Tensor:
    """query [Q, H, D]; key, value [Q, H_kv, D], the packed row's new tokens (rotary applied) -> [Q, H * D], each
    segment's queries over its cache and its new keys."""
    q, k, v = (t.transpose(0, 1)[None] for t in (query, key, value))  # [1, heads, Q, D] views
    outputs = []
    for seg in segments:
        ks, vs = extend(seg, layer, k[:, :, seg.new], v[:, :, seg.new])
        outputs.append(sdpa(q[:, :, seg.new], ks, vs, seg, scale)[0].transpose(0, 1))  # [q_i, H, D]
    return torch.cat(outputs).flatten(1)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: Segment, scale: float) -> torch.Tensor:
    """q [1, H, q_i, D]; k, v [1, H_kv, L_i + q_i, D] -> [1, H, q_i, D], through a fused kernel where one exists."""
    grouped = q.device.type not in EXPAND_KV_HEADS_ON
    if not grouped:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # [1, H, L_i + q_i, D]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=seg.mask, is_causal=seg.causal, scale=scale, enable_gqa=grouped
    )
