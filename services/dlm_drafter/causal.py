"""Causal DLM drafter (WeDLM / ReFusion family) with an exact KV cache under topological reordering.

Physical layout of every forward: [cached: prompt, commits in commit order] [pending commits] [clean context] [masks].
Position ids are always logical (002 §4.1, 000 §4.1). Only the prompt and committed tokens keep their KV, computed
exactly once, in the first forward where they stand physically in commit order; everything after is recomputed.
A mask's output predicts its own token; a clean token's output predicts the next logical token.
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from services.common.batch import Item, forward
from services.common.kv import cache_len
from services.common.models import LoadedModel
from services.common.proposal import Proposal, Region, propose_from_logits
from services.common.request import Request


@dataclass(slots=True)
class CausalCache:
    kv: DynamicCache
    committed: int = 0  # how many of req.order are in kv


class CausalDrafter:
    family = "causal"

    def __init__(self, loaded: LoadedModel):
        if loaded.mask_id is None:
            raise ValueError(f"drafter {loaded.path} has no mask token (config.mask_token_id)")
        if loaded.meta.logits_shift or loaded.bidirectional:
            raise ValueError(f"drafter {loaded.path} is not a causal DLM (bidirectional or shifted logits)")
        self.loaded = loaded
        self.model = loaded.model
        self.caches: dict[str, CausalCache] = {}

    def item(self, req: Request, ids: torch.Tensor, positions: torch.Tensor, groups: torch.Tensor | None) -> Item:
        """ids [L] at generation positions [L], preceded by the commits (and, first time, the prompt) not yet cached."""
        cache = self.caches.setdefault(req.id, CausalCache(DynamicCache()))
        pending = req.order[cache.committed :]
        prefix_ids = req.tokens[pending].tolist()
        prefix_pos = [req.prompt_len + p for p in pending]
        if cache_len(cache.kv) == 0:
            prefix_ids, prefix_pos = req.prompt_ids + prefix_ids, list(range(req.prompt_len)) + prefix_pos
        else:
            req.stats.drafter_tokens_processed += len(pending)
        req.stats.drafter_tokens_processed += len(ids)
        req.stats.drafter_forwards += 1
        cache.committed = len(req.order)
        n = len(prefix_ids)
        if groups is not None:
            groups = torch.cat([torch.full((n,), -1), groups])
        return Item(cache.kv, prefix_ids + ids.tolist(), prefix_pos + (positions + req.prompt_len).tolist(), n, groups)

    def forward_batch(self, calls: list[tuple]) -> list[torch.Tensor]:
        """calls: (req, ids [L], positions [L], groups [L] | None) -> logits [L, V] each, in one padded forward.

        groups, when given, isolate spans from each other: each sees the cache and its own span, causally.
        """
        items = [self.item(*call) for call in calls]
        logits = forward(self.model, items)
        return [out[item.keep :] for out, item in zip(logits, items, strict=True)]

    def forward(
        self, req: Request, ids: torch.Tensor, positions: torch.Tensor, groups: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.forward_batch([(req, ids, positions, groups)])[0]

    def propose_batch(self, calls: list[tuple[Request, Region]]) -> list[Proposal]:
        """Fill every masked position of each region; clean context and pending commits stand before the masks."""
        inputs = []
        for req, region in calls:
            context = req.context_positions()
            known = req.decided | req.filled
            masked = (~known[region.start : region.end]).nonzero().squeeze(-1) + region.start
            ids = torch.cat([req.tokens[context], torch.full((len(masked),), req.mask_id)])
            inputs.append((req, ids, torch.cat([context, masked]), None, len(context), masked))
        logits = self.forward_batch([call[:4] for call in inputs])
        return [
            propose_from_logits(masked, out[n:], req.sampling, req.generator, req.mask_id)
            for (req, _, _, _, n, masked), out in zip(inputs, logits, strict=True)
        ]

    def propose(self, req: Request, region: Region) -> Proposal:
        return self.propose_batch([(req, region)])[0]

    def release(self, request_id: str) -> None:
        self.caches.pop(request_id, None)

    def cached_tokens(self, request_id: str) -> int:
        cache = self.caches.get(request_id)
        return cache_len(cache.kv) if cache else 0
