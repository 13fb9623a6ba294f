"""One forward over many requests, each with its own KV cache: a step's batched model call.

Per request i: past cache of L_i tokens, new tokens q_i, the first keep_i of which join its cache afterwards.
Packed layout, without padding: one row holding every request's new tokens one after another (Q = sum q_i). The
linear layers, most of the work, then run on sum q_i tokens, not B * max q_i; attention runs per request
(packed_attention.py), each request's tokens seeing only its own cache and its own new tokens, and writes each cache.
New tokens see each other causally, or both ways where the model is bidirectional (config.is_causal False, as on
B = 1); groups, where given, isolate spans from each other.
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from services.common import flops
from services.common.kv import append, cache_len, truncate
from services.common.packed_attention import Segment


@dataclass(slots=True)
class Item:
    cache: DynamicCache
    input_ids: list[int]
    position_ids: list[int]
    keep: int  # new tokens whose KV stays in the cache
    groups: torch.Tensor | None = None  # [q] span id per new token; -1 = sees everything before it
    embeds: torch.Tensor | None = None  # [q, H] input embeddings in place of input_ids' (iteration smoothing)
    wanted: slice | None = None  # the new tokens whose logits the caller reads (None: all): the head runs on these
    rest: DynamicCache | None = None  # where given, receives the KV of the new tokens past keep


def segments(items: list[Item], causal: bool = True, device: torch.device | str = "cpu") -> list[Segment]:
    """Where each item's new tokens sit in the packed row, and what they see: [q_i, L_i + q_i]."""
    out, row = [], 0
    for item in items:
        past, n = cache_len(item.cache), len(item.input_ids)
        new = torch.ones(n, n, dtype=torch.bool)
        if causal:
            new = new.tril()
        if item.groups is not None:
            g = item.groups
            new &= (g[:, None] == g[None, :]) | (g[None, :] == -1)
        mask = torch.cat([torch.ones(n, past, dtype=torch.bool), new], dim=1)
        out.append(Segment(item.cache, slice(row, row + n), mask.to(device), item.keep, item.rest))
        row += n
    return out


@torch.inference_mode()
def forward(model: PreTrainedModel, items: list[Item]) -> list[torch.Tensor]:
    """Run every item's new tokens after its own cache -> per item logits [len(wanted), V] (float32)."""
    device = model.device
    if len(items) == 1 and items[0].groups is None:
        return [forward_one(model, items[0])]
    count_flops(model, items)
    ids = torch.tensor([t for item in items for t in item.input_ids], device=device)[None]  # [1, Q]
    pos = torch.tensor([p for item in items for p in item.position_ids], device=device)[None]
    embeds = model.get_input_embeddings()(ids)  # [1, Q, H]
    segs = segments(items, getattr(model.config, "is_causal", True), device)
    for item, seg in zip(items, segs, strict=True):
        if item.embeds is not None:
            embeds[0, seg.new] = item.embeds
    q = ids.shape[1]
    out = model.base_model(
        inputs_embeds=embeds,
        position_ids=pos,
        # The masks are the segments'; this all-True [1, 1, Q, Q] view only tells transformers a mask is prepared.
        attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device).expand(1, 1, q, q),
        use_cache=False,  # packed_sdpa writes each item's own cache
        segments=segs,
    )
    hidden = [out.last_hidden_state[0, seg.new] for seg in segs]
    return head(model, hidden, items)


def forward_one(model: PreTrainedModel, item: Item) -> torch.Tensor:
    count_flops(model, [item])
    device, past = model.device, cache_len(item.cache)
    n = len(item.input_ids)
    if item.embeds is None:
        inputs = {"input_ids": torch.tensor(item.input_ids, device=device)[None]}
    else:
        inputs = {"inputs_embeds": item.embeds[None]}
    out = model.base_model(
        **inputs,
        position_ids=torch.tensor(item.position_ids, device=device)[None],
        attention_mask=torch.ones(1, past + n, dtype=torch.long, device=device),
        past_key_values=item.cache,
        use_cache=True,
    )
    if item.rest is not None:
        append(item.rest, item.cache, slice(past + item.keep, past + n))
    truncate(item.cache, past + item.keep)
    return head(model, [out.last_hidden_state[0]], [item])[0]


def count_flops(model: PreTrainedModel, items: list[Item]) -> None:
    """Before the forward, while each cache holds only its past."""
    tokens = [len(item.input_ids) for item in items]
    attended = sum(q * (cache_len(item.cache) + q) for q, item in zip(tokens, items, strict=True))
    rows = sum(q if item.wanted is None else len(range(q)[item.wanted]) for q, item in zip(tokens, items, strict=True))
    flops.add(flops.forward_flops(model, sum(tokens), attended, rows), sum(tokens))


def head(model: PreTrainedModel, hidden: list[torch.Tensor], items: list[Item]) -> list[torch.Tensor]:
    """The vocabulary head over each item's wanted hidden states (of its [q_i, H]), in one matmul -> logits."""
    wanted = [h if item.wanted is None else h[item.wanted] for h, item in zip(hidden, items, strict=True)]
    logits = model.get_output_embeddings()(torch.cat(wanted)).float()
    return list(logits.split([len(w) for w in wanted]))
