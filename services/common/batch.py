"""One padded forward over many requests, each with its own KV cache (the @serve.batch path; B = 1 in-process).

Per request i: past cache of L_i tokens, new tokens q_i, the first keep_i of which join its cache afterwards.
Batched layout: past caches right-padded to L = max L_i, new tokens right-padded to Q = max q_i, and a 4D mask
[B, 1, Q, L + Q] that hides padding and, where groups are given, isolates spans from each other. New tokens see
each other causally, or both ways where the model is bidirectional (config.is_causal False, as on B = 1).
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from services.common.kv import cache_len, truncate


@dataclass(slots=True)
class Item:
    cache: DynamicCache
    input_ids: list[int]
    position_ids: list[int]
    keep: int  # new tokens whose KV stays in the cache
    groups: torch.Tensor | None = None  # [q] span id per new token; -1 = sees everything before it
    embeds: torch.Tensor | None = None  # [q, H] input embeddings in place of input_ids' (iteration smoothing)
    wanted: slice | None = None  # the new tokens whose logits the caller reads (None: all): the head runs on these


def attention_mask(items: list[Item], past: int, q: int, causal: bool = True) -> torch.Tensor:
    """[B, 1, Q, L + Q] bool, True = attend."""
    mask = torch.zeros(len(items), 1, q, past + q, dtype=torch.bool)
    among_new = torch.ones(q, q, dtype=torch.bool)
    if causal:
        among_new = among_new.tril()
    for b, item in enumerate(items):
        n = len(item.input_ids)
        mask[b, 0, :, : cache_len(item.cache)] = True
        new = among_new[:n, :n].clone()
        if item.groups is not None:
            g = item.groups
            new &= (g[:, None] == g[None, :]) | (g[None, :] == -1)
        mask[b, 0, :n, past : past + n] = new
        mask[b, 0, n:, past:] = torch.eye(q, dtype=torch.bool)[n:]  # padding rows attend to themselves only
    return mask


@torch.inference_mode()
def forward(model: PreTrainedModel, items: list[Item]) -> list[torch.Tensor]:
    """Run every item's new tokens after its own cache -> per item logits [len(wanted), V] (float32)."""
    device = model.device
    if len(items) == 1 and items[0].groups is None:
        return [forward_one(model, items[0])]
    past = max(cache_len(item.cache) for item in items)
    q = max(len(item.input_ids) for item in items)
    ids = torch.zeros(len(items), q, dtype=torch.long)
    pos = torch.zeros(len(items), q, dtype=torch.long)
    for b, item in enumerate(items):
        ids[b, : len(item.input_ids)] = torch.tensor(item.input_ids)
        pos[b, : len(item.position_ids)] = torch.tensor(item.position_ids)
    embeds = model.get_input_embeddings()(ids.to(device))  # [B, Q, H]
    for b, item in enumerate(items):
        if item.embeds is not None:
            embeds[b, : len(item.input_ids)] = item.embeds
    batched = stack([item.cache for item in items], past, model)
    out = model.base_model(
        inputs_embeds=embeds,
        position_ids=pos.to(device),
        attention_mask=attention_mask(items, past, q, getattr(model.config, "is_causal", True)).to(device),
        past_key_values=batched,
        use_cache=True,
    )
    for b, item in enumerate(items):
        extend(item.cache, batched, b, past, item.keep)
    hidden = [out.last_hidden_state[b, : len(item.input_ids)] for b, item in enumerate(items)]
    return head(model, hidden, items)


def forward_one(model: PreTrainedModel, item: Item) -> torch.Tensor:
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
    truncate(item.cache, past + item.keep)
    return head(model, [out.last_hidden_state[0]], [item])[0]


def head(model: PreTrainedModel, hidden: list[torch.Tensor], items: list[Item]) -> list[torch.Tensor]:
    """The vocabulary head over each item's wanted hidden states (of its [q_i, H]), in one matmul -> logits."""
    wanted = [h if item.wanted is None else h[item.wanted] for h, item in zip(hidden, items, strict=True)]
    logits = model.get_output_embeddings()(torch.cat(wanted)).float()
    return list(logits.split([len(w) for w in wanted]))


def stack(caches: list[DynamicCache], length: int, model: PreTrainedModel) -> DynamicCache:
    """A batched cache: every request's KV right-padded with zeros to `length`."""
    batched = DynamicCache()
    for layer in range(model.config.num_hidden_layers):
        keys, values = [], []
        for cache in caches:
            k, v = layer_kv(cache, layer, model)
            pad = length - k.shape[-2]
            keys.append(torch.nn.functional.pad(k, (0, 0, 0, pad)))
            values.append(torch.nn.functional.pad(v, (0, 0, 0, pad)))
        batched.update(torch.cat(keys), torch.cat(values), layer)
    return batched


def layer_kv(cache: DynamicCache, layer: int, model: PreTrainedModel) -> tuple[torch.Tensor, torch.Tensor]:
    if cache_len(cache) == 0:
        cfg = model.config
        heads = cfg.num_key_value_heads
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        empty = torch.zeros(1, heads, 0, dim, dtype=model.dtype, device=model.device)
        return empty, empty
    return cache.layers[layer].keys, cache.layers[layer].values


def extend(cache: DynamicCache, batched: DynamicCache, b: int, past: int, keep: int) -> None:
    """Append row b's first `keep` new entries of the batched cache to the request's own cache."""
    for layer in range(len(batched.layers)):
        k = batched.layers[layer].keys[b : b + 1, :, past : past + keep]
        v = batched.layers[layer].values[b : b + 1, :, past : past + keep]
        if len(cache.layers) > layer and cache.layers[layer].is_initialized:
            cache.layers[layer].keys = torch.cat([cache.layers[layer].keys, k], dim=-2)
            cache.layers[layer].values = torch.cat([cache.layers[layer].values, v], dim=-2)
        else:
            cache.update(k, v, layer)
