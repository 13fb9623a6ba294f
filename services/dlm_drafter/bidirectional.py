"""Bidirectional MDM drafter (LLaDA / Dream family): full attention over prompt + canvas, blockwise.

Cache modes, refreshed at each new block:
  none       every forward covers the whole sequence (LLaDA baseline)
  prefix     Fast-dLLM prefix cache: a full forward at a block's start, then [block, suffix] over the cached prefix
  dual       Fast-dLLM dual cache: a full forward at a block's start, then the block alone over prefix + suffix KV
  freecache  FlashDLM FreeCache (003 §3.2.1): the window [block, suffix] is recomputed over frozen earlier blocks;
             a finished block freezes with the KV of the first forward in which it was fully unmasked
  vicinity   dInfer vicinity refresh (001 §2.3, App. D): the request's first warmup_times forwards run uncached; then
             a full forward at a block's start refreshes every position's KV, and the block's other forwards recompute
             the block widened by prefix_look positions before it and after_look after it over the rest's KV
Iteration smoothing (001 A.1) mixes the last forward's expected embedding into masked inputs of the block.
A model with logits_shift s (Dream: 1) predicts position i from its output at i - s: every recomputed window then
starts s positions before the block, and the cache keeps the physical prefix before that cut.
"""

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from services.common.batch import Item, forward
from services.common.contract import CACHE_MODES, Smoothing, Vicinity
from services.common.kv import cache_len, drop_range, truncate
from services.common.models import LoadedModel
from services.common.proposal import Proposal, Region, propose_from_logits
from services.common.request import Request


@dataclass(slots=True)
class BlockCache:
    kv: DynamicCache
    block_start: int = -1
    frozen: int = 0  # generation positions [0, frozen) have KV in kv (after the prompt)
    step: int = 0  # forwards within the current block
    forwards: int = 0  # forwards of the request (dInfer's iter_no): vicinity's warm-up counts them
    last_probs: torch.Tensor | None = None  # [end - start, V] previous forward's distribution over the block
    prefilled: bool = False


def new_cache() -> BlockCache:
    return BlockCache(DynamicCache())


@dataclass(slots=True)
class BidirectionalCall:
    req: Request
    region: Region
    state: BlockCache  # the request's cache, owned by the caller; a new request brings BlockCache(DynamicCache())
    cache: str  # one of CACHE_MODES
    smoothing: Smoothing | None
    vicinity: Vicinity = field(default_factory=Vicinity)  # read by cache "vicinity" only


class BidirectionalDrafter:
    """Stateless over requests: each call brings its cache state, cache mode and smoothing."""

    family = "bidirectional"

    def __init__(self, loaded: LoadedModel):
        if loaded.mask_id is None:
            raise ValueError(f"drafter {loaded.path} has no mask token (config.mask_token_id)")
        self.loaded = loaded
        self.decoder = loaded.decoder
        self.shift = loaded.meta.logits_shift

    @torch.inference_mode()
    def propose_batch(self, calls: list[BidirectionalCall]) -> list[tuple[Proposal, int]]:
        """Every call in one padded forward -> (its proposal, token instances it pushed through the model).

        Mixed cache modes share the forward: each row sees only its own cache (whatever its physical layout: RoPE
        is already in the cached keys) and its own new tokens, both ways.
        """
        for call in calls:
            if call.cache not in CACHE_MODES:
                raise ValueError(f"cache must be one of {CACHE_MODES}, got {call.cache!r}")
        plans = [self.plan(call) for call in calls]
        logits = forward(self.decoder, [item for item, _, _ in plans])
        return [self.finish(call, *plan, out) for call, plan, out in zip(calls, plans, logits, strict=True)]

    def plan(self, call: BidirectionalCall) -> tuple[Item, int, int]:
        """The call's row of the batch, with its past cache length and the physical start lo of its window."""
        req, region, state = call.req, call.region, call.state
        if region.start != state.block_start:
            enter_block(state, region, call.cache)
        P, end = req.prompt_len, req.horizon
        cut = P + region.start - self.shift
        if call.cache == "freecache" and cache_len(state.kv) > cut:
            # a request resumed from an earlier round (a takeover) behind the blocks this cache froze: the KV before
            # its block is what it was then, deterministically, and the rest goes
            truncate(state.kv, cut)
            state.frozen = min(state.frozen, region.start)
        seq = req.prompt_ids + req.tokens[:end].tolist()  # [P + horizon]
        past = cache_len(state.kv)
        lo, hi = self.span(call, P, end)
        keep = self.kept(call, P, past, hi - lo)
        first = P + region.start - self.shift - lo  # the output predicting the block's first position
        wanted = slice(first, first + region.end - region.start)  # logits [block, V]
        item = Item(state.kv, seq[lo:hi], list(range(lo, hi)), keep, embeds=self.smoothed(call, seq, lo, hi))
        item.wanted = wanted
        return item, past, lo

    def finish(
        self, call: BidirectionalCall, item: Item, past: int, lo: int, logits: torch.Tensor
    ) -> tuple[Proposal, int]:
        req, region, state = call.req, call.region, call.state
        P = req.prompt_len
        if call.cache in ("dual", "vicinity") and past == 0 and cache_len(state.kv):
            drop_range(state.kv, *self.window(call, P, req.horizon))  # keep the full forward's KV around the window
        elif call.cache in ("prefix", "freecache"):
            state.frozen = region.start
        tokens = len(item.input_ids) - (P if not state.prefilled else 0)
        state.prefilled = True
        masked = (~req.decided[region.start : region.end]).nonzero().squeeze(-1)
        if call.smoothing:
            state.last_probs = torch.softmax(logits, -1)
        state.step += 1
        state.forwards += 1
        proposal = propose_from_logits(
            masked + region.start, logits[masked], req.sampling, req.rng, req.mask_id, self.decoder.ops
        )
        return proposal, tokens

    def span(self, call: BidirectionalCall, P: int, end: int) -> tuple[int, int]:
        """Physical span [lo, hi) of prompt + canvas that this forward recomputes."""
        state, region = call.state, call.region
        if call.cache == "none" or cache_len(state.kv) == 0:
            return 0, P + end
        if call.cache in ("dual", "vicinity"):
            return self.window(call, P, end)
        if call.cache == "prefix":
            return P + region.start - self.shift, P + end
        return P + state.frozen - self.shift, P + end

    def window(self, call: BidirectionalCall, P: int, end: int) -> tuple[int, int]:
        """Physical [lo, hi) that dual and vicinity recompute over the cache: the block, from the output predicting
        its first position, widened for vicinity by its look-behind and look-ahead (clipped to prompt + canvas)."""
        region, looks = call.region, call.vicinity
        behind, ahead = (looks.prefix_look, looks.after_look) if call.cache == "vicinity" else (0, 0)
        return max(0, P + region.start - self.shift - behind), min(P + end, P + region.end + ahead)

    def kept(self, call: BidirectionalCall, P: int, past: int, new: int) -> int:
        """How many of the forward's new tokens join the cache (all, for a full forward of dual and vicinity: finish
        cuts their window; none during vicinity's warm-up)."""
        warming = call.cache == "vicinity" and call.state.forwards < call.vicinity.warmup_times
        if call.cache == "none" or warming or (call.cache in ("dual", "vicinity") and past > 0):
            return 0
        if call.cache in ("dual", "vicinity"):
            return new
        return P + call.region.start - self.shift - past  # prefix, freecache: the cache ends where the window starts

    def smoothed(self, call: BidirectionalCall, seq: list[int], lo: int, hi: int) -> torch.Tensor | None:
        """[hi - lo, H] inputs with alpha * expected embedding added at the block's masks; None without smoothing."""
        req, region, state = call.req, call.region, call.state
        if call.smoothing is None or state.last_probs is None:
            return None
        weight = self.decoder.embedding  # [V, H]
        embeds = weight[torch.tensor(seq[lo:hi], device=weight.device)]
        alpha = call.smoothing.alpha(state.step)
        block = torch.arange(region.start, region.end)
        masked = ~req.decided[block]
        rows = block[masked] + req.prompt_len - lo
        last = state.last_probs[: len(block)]  # an EOS may have cut the block since the last forward
        embeds[rows] = embeds[rows] + alpha * (last[masked].to(weight.dtype) @ weight)
        return embeds


def enter_block(state: BlockCache, region: Region, cache: str) -> None:
    state.block_start, state.step, state.last_probs = region.start, 0, None
    if cache in ("prefix", "dual", "vicinity"):
        truncate(state.kv, 0)  # a full refresh at every new block
