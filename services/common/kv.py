"""KV-cache surgery on transformers DynamicCache (crop takes a negative count in transformers 5)."""

import torch
from transformers import DynamicCache


def cache_len(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def truncate(cache: DynamicCache, length: int) -> None:
    extra = cache_len(cache) - length
    if extra > 0:
        cache.crop(-extra)


def drop_range(cache: DynamicCache, start: int, end: int) -> None:
    """Remove physical entries [start, end) from every layer."""
    for layer in cache.layers:
        layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys[..., end:, :]], dim=-2)
        layer.values = torch.cat([layer.values[..., :start, :], layer.values[..., end:, :]], dim=-2)
