"""KV-cache surgery on transformers DynamicCache (crop takes a negative count in transformers 5)."""

import torch
from transformers import DynamicCache


def head_dim(config) -> int:
    """The size of one attention head's key and value vectors, from a model's config."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def cache_len(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def truncate(cache: DynamicCache, length: int) -> None:
    extra = cache_len(cache) - length
    if extra > 0:
        cache.crop(-extra)


def append(cache: DynamicCache, source: DynamicCache, index: slice | torch.Tensor) -> None:
    """Append source's physical entries `index` (a slice, or entry indices in the order wanted) to cache."""
    for layer in range(len(source.layers)):
        keys, values = source.layers[layer].keys, source.layers[layer].values
        at = index.to(keys.device) if isinstance(index, torch.Tensor) else index
        k, v = keys[:, :, at], values[:, :, at]
        if len(cache.layers) > layer and cache.layers[layer].is_initialized:
            cache.layers[layer].keys = torch.cat([cache.layers[layer].keys, k], dim=-2)
            cache.layers[layer].values = torch.cat([cache.layers[layer].values, v], dim=-2)
        else:
            cache.update(k, v, layer)


def drop_range(cache: DynamicCache, start: int, end: int) -> None:
    """Remove physical entries [start, end) from every layer."""
    for layer in cache.layers:
        layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys[..., end:, :]], dim=-2)
        layer.values = torch.cat([layer.values[..., :start, :], layer.values[..., end:, :]], dim=-2)
