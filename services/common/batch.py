"""One forward over many requests, each with its own KV cache: a step's batched model call.

Per request i: past cache of L_i tokens, new tokens q_i, the first keep_i of which join its cache afterwards.
Packed layout, without padding: one row holding every request's new tokens one after another (Q = sum q_i). The
linear layers, most of the work, then run on sum q_i tokens, not B * max q_i; attention runs per request
(packed_attention.py), each request's tokens seeing only its own cache and its own new tokens, and writes each cache.
New tokens see each other causally, or both ways where the model is bidirectional (decoder.causal False); groups,
where given, isolate spans from each other. One request is a packed row of one.
"""

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import DynamicCache

from services.common import flops
from services.common.kv import cache_len
from services.common.lean_ops import Ops
from services.common.packed_attention import Segment


class Decoder(Protocol):
    """A host's model as its forwards run it: lean_model.LeanModel, or a test's scripted model."""

    embedding: torch.Tensor  # [V, H] input embeddings
    causal: bool
    ops: Ops  # what the hosts read of its logits with (proposal.LogitMaths), as the decoder's own ops

    @property
    def device(self) -> torch.device: ...

    def decode(
        self, hidden: torch.Tensor, positions: torch.Tensor, segments: list[Segment], rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """hidden [Q, H] at positions [Q] -> last hidden states of rows [R] (every row where None), [R, H], writing
        each segment's cache."""
        ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, H] rows of decode's output -> float32 logits [R, V]."""
        ...

    def flops(self, tokens: int, attended: int, rows: int) -> int: ...


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


def segments(items: list[Item], causal: bool, like: torch.Tensor) -> list[Segment]:
    """Where each item's new tokens sit in the packed row, and what they see."""
    out, row = [], 0
    for item in items:
        past, n = cache_len(item.cache), len(item.input_ids)
        mask = mask_of(item.groups, past, n, causal, like)
        plain_causal = mask is None and causal and past == 0
        out.append(Segment(item.cache, slice(row, row + n), mask, item.keep, item.rest, plain_causal))
        row += n
    return out


def mask_of(groups: torch.Tensor | None, past: int, n: int, causal: bool, like: torch.Tensor) -> torch.Tensor | None:
    """What n new tokens after a past of `past` see: a mask [n, past + n] added to the scores (0 or -inf, in like's
    dtype and on its device, made once for every layer), or None where SDPA's own cases say it (every key; causal
    without a past)."""
    if groups is None:
        if not causal or past == 0 or n == 1:
            return None
        # causal after the past: query i sees keys up to past + i
        return torch.full((n, past + n), float("-inf"), dtype=like.dtype, device=like.device).triu(past + 1)
    new = torch.ones(n, n, dtype=torch.bool)
    if causal:
        new = new.tril()
    new &= (groups[:, None] == groups[None, :]) | (groups[None, :] == -1)
    hidden = torch.cat([torch.zeros(n, past, dtype=torch.bool), ~new], dim=1)
    return torch.zeros(hidden.shape, dtype=like.dtype).masked_fill_(hidden, float("-inf")).to(like.device)


@torch.inference_mode()
def forward(model: Decoder, items: list[Item]) -> list[torch.Tensor]:
    """Run every item's new tokens after its own cache -> per item logits [len(wanted), V] (float32)."""
    count_flops(model, items)
    device = model.device
    ids = torch.tensor([t for item in items for t in item.input_ids], device=device)  # [Q]
    pos = torch.tensor([p for item in items for p in item.position_ids], device=device)
    hidden = model.embedding[ids]  # [Q, H]
    segs = segments(items, model.causal, model.embedding)
    for item, seg in zip(items, segs, strict=True):
        if item.embeds is not None:
            hidden[seg.new] = item.embeds
    rows = [
        range(seg.new.start, seg.new.stop)[item.wanted or slice(None)] for item, seg in zip(items, segs, strict=True)
    ]
    index = torch.tensor([r for w in rows for r in w], dtype=torch.long, device=device)
    hidden = model.decode(hidden, pos, segs, None if len(index) == len(ids) else index)  # the wanted rows only
    return list(model.logits(hidden).split([len(w) for w in rows]))


def count_flops(model: Decoder, items: list[Item]) -> None:
    """Before the forward, while each cache holds only its past."""
    tokens = [len(item.input_ids) for item in items]
    attended = sum(q * (cache_len(item.cache) + q) for q, item in zip(tokens, items, strict=True))
    rows = sum(q if item.wanted is None else len(range(q)[item.wanted]) for q, item in zip(tokens, items, strict=True))
    flops.add(model.flops(sum(tokens), attended, rows), sum(tokens))
