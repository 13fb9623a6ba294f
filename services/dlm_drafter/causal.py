"""Causal DLM drafter (WeDLM / ReFusion family) with an exact KV cache under topological reordering.

Physical layout of every forward: [cached: prompt, commits in commit order] [pending commits] [clean context] [masks].
Position ids are always logical (002 §4.1, 000 §4.1). Only the prompt and committed tokens keep their KV, computed
exactly once, in the first forward where they stand physically in commit order; everything after is recomputed.
A mask's output predicts its own token; a clean token's output predicts the next logical token.
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from services.common.kv import cache_len, isolation_mask, truncate
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
        self.loaded = loaded
        self.model = loaded.model
        self.caches: dict[str, CausalCache] = {}

    @torch.inference_mode()
    def forward(
        self, req: Request, ids: torch.Tensor, positions: torch.Tensor, groups: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run ids [L] at generation positions [L] after the request's cache -> logits [L, V].

        groups [L], when given, isolates spans from each other (each sees the cache and its own span causally).
        """
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
        past, n = cache_len(cache.kv), len(prefix_ids)
        device = self.model.device
        input_ids = torch.tensor(prefix_ids + ids.tolist(), device=device)[None]
        position_ids = torch.tensor(prefix_pos + (positions + req.prompt_len).tolist(), device=device)[None]
        if groups is None:
            mask = torch.ones(1, past + input_ids.shape[1], dtype=torch.long, device=device)
        else:
            mask = isolation_mask(past, torch.cat([torch.full((n,), -1), groups]), device)
            mask[..., n:, past : past + n] = True  # every span sees the pending prefix
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask,
            past_key_values=cache.kv,
            use_cache=True,
        )
        truncate(cache.kv, past + n)
        cache.committed = len(req.order)
        return out.logits[0, n:].float()

    def propose(self, req: Request, region: Region) -> Proposal:
        """Fill every masked position of the region; clean context and pending commits stand before the masks."""
        context = req.context_positions()
        known = req.decided | req.filled
        masked = (~known[region.start : region.end]).nonzero().squeeze(-1) + region.start
        ids = torch.cat([req.tokens[context], torch.full((len(masked),), req.mask_id)])
        logits = self.forward(req, ids, torch.cat([context, masked]))[len(context) :]
        return propose_from_logits(masked, logits, req.sampling, req.generator, req.mask_id)

    def release(self, request_id: str) -> None:
        self.caches.pop(request_id, None)

    def cached_tokens(self, request_id: str) -> int:
        cache = self.caches.get(request_id)
        return cache_len(cache.kv) if cache else 0
