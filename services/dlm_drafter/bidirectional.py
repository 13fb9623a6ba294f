"""Bidirectional MDM drafter (LLaDA / Dream family): full attention over prompt + canvas, blockwise.

Cache modes, refreshed at each new block:
  none       every forward covers the whole sequence (LLaDA baseline)
  prefix     Fast-dLLM prefix cache: a full forward at a block's start, then [block, suffix] over the cached prefix
  dual       Fast-dLLM dual cache: a full forward at a block's start, then the block alone over prefix + suffix KV
  freecache  FlashDLM FreeCache (003 §3.2.1): the window [block, suffix] is recomputed over frozen earlier blocks;
             a finished block freezes with the KV of the first forward in which it was fully unmasked
Iteration smoothing (001 A.1) mixes the last forward's expected embedding into masked inputs of the block.
A model with logits_shift s (Dream: 1) predicts position i from its output at i - s: every recomputed window then
starts s positions before the block, and the cache keeps the physical prefix before that cut.
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from services.common.kv import drop_range, truncate
from services.common.models import LoadedModel
from services.common.proposal import Proposal, Region, propose_from_logits
from services.common.request import Request

CACHE_MODES = ("none", "prefix", "dual", "freecache")


@dataclass(slots=True)
class Smoothing:
    alpha_init: float = 0.1
    alpha_growth: float = 0.05
    alpha_max: float = 0.3  # dInfer App. D cont_weight

    def alpha(self, step: int) -> float:
        return min(self.alpha_init + self.alpha_growth * step, self.alpha_max)


@dataclass(slots=True)
class BlockCache:
    kv: DynamicCache
    block_start: int = -1
    frozen: int = 0  # generation positions [0, frozen) have KV in kv (after the prompt)
    step: int = 0  # forwards within the current block
    last_probs: torch.Tensor | None = None  # [end - start, V] previous forward's distribution over the block
    prefilled: bool = False


def new_cache() -> BlockCache:
    return BlockCache(DynamicCache())


@dataclass(slots=True)
class BidirectionalCall:
    req: Request
    region: Region
    state: BlockCache  # the request's cache, owned by the caller's KV manager
    cache: str  # cache mode
    smoothing: Smoothing | None


class BidirectionalDrafter:
    family = "bidirectional"

    def __init__(self, loaded: LoadedModel):
        if loaded.mask_id is None:
            raise ValueError(f"drafter {loaded.path} has no mask token (config.mask_token_id)")
        self.loaded = loaded
        self.model = loaded.model
        self.shift = loaded.meta.logits_shift

    def propose_batch(self, calls: list[BidirectionalCall]) -> list[tuple[Proposal, int]]:
        out = []
        for call in calls:
            self.cache_mode, self.smoothing = call.cache, call.smoothing
            out.append(self.propose(call.req, call.region, call.state))
        return out

    @torch.inference_mode()
    def propose(self, req: Request, region: Region, state: BlockCache) -> tuple[Proposal, int]:
        if region.start != state.block_start:
            self.enter_block(state, region)
        P, end = req.prompt_len, req.horizon
        seq = torch.tensor(req.prompt_ids + req.tokens[:end].tolist())  # [P + horizon]
        past = state.kv.get_seq_length()
        lo, hi = self.span(state, region, P, end)
        out = self.model(
            inputs_embeds=self.embed(req, state, seq, region, lo, hi)[None],
            position_ids=torch.arange(lo, hi, device=self.model.device)[None],
            attention_mask=torch.ones(1, past + hi - lo, dtype=torch.long, device=self.model.device),
            past_key_values=state.kv,
            use_cache=True,
        )
        tokens = hi - lo - (P if not state.prefilled else 0)
        state.prefilled = True
        self.keep(state, region, P, past)
        first = P + region.start - self.shift - lo  # the output predicting the block's first position
        logits = out.logits[0, first : first + region.end - region.start].float()  # [block, V]
        masked = (~req.decided[region.start : region.end]).nonzero().squeeze(-1)
        if self.smoothing:
            state.last_probs = torch.softmax(logits, -1)
        state.step += 1
        proposal = propose_from_logits(masked + region.start, logits[masked], req.sampling, req.generator, req.mask_id)
        return proposal, tokens

    def enter_block(self, state: BlockCache, region: Region) -> None:
        state.block_start, state.step, state.last_probs = region.start, 0, None
        if self.cache_mode in ("prefix", "dual"):
            truncate(state.kv, 0)  # a full refresh at every new block

    def span(self, state: BlockCache, region: Region, P: int, end: int) -> tuple[int, int]:
        """Physical span [lo, hi) of prompt + canvas that this forward recomputes."""
        if self.cache_mode == "none" or state.kv.get_seq_length() == 0:
            return 0, P + end
        if self.cache_mode == "dual":
            return P + region.start - self.shift, P + region.end
        if self.cache_mode == "prefix":
            return P + region.start - self.shift, P + end
        return P + state.frozen - self.shift, P + end

    def keep(self, state: BlockCache, region: Region, P: int, past: int) -> None:
        if self.cache_mode == "none":
            truncate(state.kv, 0)
        elif self.cache_mode == "dual":
            if past == 0:  # keep prefix and suffix of the full forward; order is free under full attention
                drop_range(state.kv, P + region.start - self.shift, P + region.end)
            else:
                truncate(state.kv, past)
        else:
            state.frozen = region.start
            truncate(state.kv, P + region.start - self.shift)

    def embed(self, req: Request, state: BlockCache, seq: torch.Tensor, region: Region, lo: int, hi: int):
        embeds = self.model.get_input_embeddings()(seq[lo:hi].to(self.model.device))
        if self.smoothing is None or state.last_probs is None:
            return embeds
        weight = self.model.get_input_embeddings().weight
        alpha = self.smoothing.alpha(state.step)
        block = torch.arange(region.start, region.end)
        masked = ~req.decided[block]
        rows = block[masked] + req.prompt_len - lo
        last = state.last_probs[: len(block)]  # an EOS may have cut the block since the last forward
        embeds[rows] = embeds[rows] + alpha * (last[masked].to(weight.dtype) @ weight)
        return embeds
