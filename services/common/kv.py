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


def isolation_mask(past: int, groups: torch.Tensor, device: torch.device) -> torch.Tensor:
    """4D bool mask [1, 1, Q, past + Q]: every query sees the whole past and, causally, its own group only."""
    q = len(groups)
    causal = torch.ones(q, q, dtype=torch.bool, device=device).tril()
    same = groups[:, None].to(device) == groups[None, :].to(device)
    full = torch.ones(q, past, dtype=torch.bool, device=device)
    return torch.cat([full, causal & same], dim=1)[None, None]
