"""KV-cache surgery on transformers DynamicCache (crop takes a negative count in transformers 5)."""

import torch
from transformers import DynamicCache


def cache_len(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def truncate(cache: DynamicCache, length: int) -> None:
    extra = cache_len(cache) - length
    if extra > 0:
        cache.crop(-extra)


def layer_kv(cache: DynamicCache, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A layer's keys and values [1, H_kv, L, D], or None before its first entry."""
    if len(cache.layers) > layer and cache.layers[layer].is_initialized:
        return cache.layers[layer].keys, cache.layers[layer].values
    return None


def set_layer(cache: DynamicCache, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Make a layer's entries these (DynamicCache.update creates the layer on its first write)."""
    if layer_kv(cache, layer) is None:
        cache.update(keys, values, layer)
    else:
        cache.layers[layer].keys, cache.layers[layer].values = keys, values


def append(cache: DynamicCache, source: DynamicCache, index: slice | torch.Tensor) -> None:
    """Append source's physical entries `index` (a slice, or entry indices in the order wanted) to cache."""
    for layer in range(len(source.layers)):
        keys, values = source.layers[layer].keys, source.layers[layer].values
        at = index.to(keys.device) if isinstance(index, torch.Tensor) else index
        k, v = keys[:, :, at], values[:, :, at]
        past = layer_kv(cache, layer)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=-2), torch.cat([past[1], v], dim=-2)
        set_layer(cache, layer, k, v)


def drop_range(cache: DynamicCache, start: int, end: int) -> None:
    """Remove physical entries [start, end) from every layer."""
    for layer in cache.layers:
        layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys[..., end:, :]], dim=-2)
        layer.values = torch.cat([layer.values[..., :start, :], layer.values[..., end:, :]], dim=-2)
