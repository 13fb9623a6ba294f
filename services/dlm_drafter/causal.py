"""Causal DLM drafter (WeDLM / ReFusion family) with an exact KV cache under topological reordering.

Physical layout of every forward: [cached: prompt, commits in commit order] [pending commits] [clean context] [masks].
Position ids are always logical (002 §4.1, 000 §4.1). Only the prompt and committed tokens keep their KV, computed
exactly once, in the first forward where they stand physically in commit order; everything after is recomputed.
A mask's output predicts its own token; a clean token's output predicts the next logical token.

ReFusion's KV reuse (000 §4.2, C.3): a forward asked to stage its new tokens' KV keeps it on this replica; the commits
made before the request's next forward take that KV instead of being recomputed as pending commits. A token staged
inside an isolated span attended to the cache and its span only, not to the slots committed with it: the paper's
approximation. Staged KV lives one round: the next forward of the request uses what it can and drops it.

The cache checks its commits against the request at every forward and drops those the request no longer holds, with
every later one (a request taken over from an earlier record). Overlap's guesses (propose_after_batch) draft the next
window for several counts of a round's drafts accepted, each in a span of its own, and keep none of those spans' KV:
no speculative token ever enters the cache.
"""

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from services.common.batch import Item, forward
from services.common.kv import append, cache_len, truncate
from services.common.kv_manager import KVManager
from services.common.models import LoadedModel
from services.common.proposal import Proposal, Region, TokenLogprobs, Verdict, propose_from_logits
from services.common.request import Request


@dataclass(slots=True)
class Staged:
    kv: DynamicCache  # one entry per staged token
    positions: list[int]  # generation position of each entry
    ids: list[int]  # the token each entry was computed from
    order: int  # len(req.order) when staged: only the commits made after it may take these entries
    round: int  # req.stats.rounds when staged: only the next round's first forward may take them


@dataclass(slots=True)
class CausalCache:
    kv: DynamicCache
    positions: list[int] = field(default_factory=list)  # the commits in kv, in order (a prefix of req.order)
    tokens: list[int] = field(default_factory=list)  # the token each was computed from
    staged: Staged | None = None

    @property
    def committed(self) -> int:
        """How many of req.order are in kv."""
        return len(self.positions)

    def add(self, positions: list[int], tokens: list[int]) -> None:
        self.positions += positions
        self.tokens += tokens


def new_cache() -> CausalCache:
    return CausalCache(DynamicCache())


class CausalDrafter:
    family = "causal"

    def __init__(self, loaded: LoadedModel, kv: KVManager):
        if loaded.mask_id is None:
            raise ValueError(f"drafter {loaded.path} has no mask token (config.mask_token_id)")
        if loaded.meta.logits_shift or loaded.bidirectional:
            raise ValueError(f"drafter {loaded.path} is not a causal DLM (bidirectional or shifted logits)")
        self.loaded = loaded
        self.decoder = loaded.decoder
        self.kv = kv

    def item(
        self, req: Request, ids: torch.Tensor, positions: torch.Tensor, groups: torch.Tensor | None, stage: bool = False
    ):
        """ids [L] at generation positions [L], preceded by the commits (and, first time, the prompt) not yet cached;
        stage: keep the KV of ids for the next forward (000 §4.2 KV reuse).
        -> the forward's Item, and the token instances it processes past the prompt's prefill (p_cache's N_fwd)."""
        cache = self.kv.get(req, new_cache)
        roll_back(cache, req)
        reuse_staged(cache, req)
        pending = req.order[cache.committed :]
        pending_ids = prefix_ids = req.tokens[pending].tolist()
        prefix_pos = [req.prompt_len + p for p in pending]
        processed = len(pending) + len(ids)
        if cache_len(cache.kv) == 0:
            prefix_ids, prefix_pos = req.prompt_ids + prefix_ids, list(range(req.prompt_len)) + prefix_pos
            processed = len(ids)
            self.kv.prefilled += len(prefix_ids)
        cache.add(pending, pending_ids)
        n = len(prefix_ids)
        if groups is not None:
            groups = torch.cat([torch.full((n,), -1), groups])
        pos = prefix_pos + (positions + req.prompt_len).tolist()
        rest = None
        if stage:
            rest = DynamicCache()
            cache.staged = Staged(rest, positions.tolist(), ids.tolist(), len(req.order), req.stats.rounds)
        item = Item(cache.kv, prefix_ids + ids.tolist(), pos, n, groups, wanted=slice(n, None), rest=rest)
        return item, processed

    def forward_batch(self, calls: list[tuple]) -> list[tuple[torch.Tensor, int]]:
        """calls: (req, ids [L], positions [L], groups [L] | None[, stage]) -> (logits [L, V], tokens processed)
        each, in one padded forward.

        groups, when given, isolate spans from each other: each sees the cache and its own span, causally.
        """
        items, processed = zip(*[self.item(*call) for call in calls], strict=True)
        return list(zip(forward(self.decoder, list(items)), processed, strict=True))

    def fill_masks_batch(self, calls: list[tuple]) -> list[tuple[Proposal, int]]:
        """calls: (req, ids [L], positions [L], groups [L]) -> (the proposal for the positions whose id is the mask,
        drawn here; tokens processed) each, in one forward."""
        out = []
        for (req, ids, positions, _), (logits, tokens) in zip(calls, self.forward_batch(calls), strict=True):
            masked = ids == req.mask_id
            out.append(
                (propose_from_logits(positions[masked], logits[masked], req.sampling, req.rng, req.mask_id), tokens)
            )
        return out

    def score_draft_batch(self, calls: list[tuple]) -> list[tuple[Verdict, int]]:
        """calls: (req, draft [L], positions [L], groups [L] | None, stage) -> (next_token_verdict, tokens
        processed) each, in one forward: the [L, V] logits stay here."""
        return [
            (next_token_verdict(logits, call[1], call[2], call[0].sampling.logprobs), tokens)
            for call, (logits, tokens) in zip(calls, self.forward_batch(calls), strict=True)
        ]

    def propose_batch(self, calls: list[tuple[Request, Region, bool]]) -> list[tuple[Proposal, int]]:
        """Fill every masked position of each region; clean context and pending commits stand before the masks.

        ar_head: the first masked position is drafted from the output of the clean token just before it (the
        drafter's next-token head: its own left-to-right decode) where that token stands in this forward, as the
        last commit does at the frontier; every other mask from its own output."""
        items, processed, reads = [], [], []
        for req, region, ar_head in calls:
            context = req.context_positions()
            known = req.decided | req.filled
            masked = (~known[region.start : region.end]).nonzero().squeeze(-1) + region.start
            ids = torch.cat([req.tokens[context], torch.full((len(masked),), req.mask_id)])
            before = int(masked[0]) - 1 if ar_head and len(masked) else None  # where the head's input stands
            if before is not None:  # the head reads that token's output: it must run in this forward
                uncache(self.kv.get(req, new_cache), req, before)
            item, tokens = self.item(req, ids, torch.cat([context, masked]), None)
            head = input_at(item, req.prompt_len + before) if before is not None else None
            if head is not None:
                item.wanted = slice(min(head, item.keep), None)
            items.append(item)
            processed.append(tokens)
            reads.append((masked, head))
        proposals = []
        for (req, _, _), item, logits, (masked, head) in zip(
            calls, items, forward(self.decoder, items), reads, strict=True
        ):
            rows = logits[len(logits) - len(masked) :]  # [len(masked), V]: the masks stand last
            if head is not None:
                rows = torch.cat([logits[head - item.wanted.start][None], rows[1:]])
            proposals.append(propose_from_logits(masked, rows, req.sampling, req.rng, req.mask_id, self.decoder.ops))
        return list(zip(proposals, processed, strict=True))

    def propose_after_batch(
        self, calls: list[tuple[Request, int, torch.Tensor, tuple[int, ...], tuple[int, ...], bool]]
    ) -> list[tuple[list[Proposal], int, int]]:
        """calls: (req, start, drafts [L], counts, ends, ar_head) -> each count's proposal, the request's count of
        draws after any one of them (each guess draws from its own copy of the RNG, as the next round's proposal
        would), and the token instances processed, in one forward.

        Guess g (n = counts[g]) is the forward propose_batch would run for the request with drafts[:n] committed:
        those drafts, then masks from start + n to ends[g], in a span of its own that sees the cache (and the commits
        still pending, which join it) and itself, causally. With ar_head the first mask takes the output of the last
        accepted draft. Only the pending commits' KV stays: the spans' is dropped."""
        items, processed, layouts = [], [], []
        for req, start, drafts, counts, ends, _ in calls:
            ids, positions, groups, layout = [], [], [], []
            for g, (n, end) in enumerate(zip(counts, ends, strict=True)):
                masked = torch.arange(start + n, end)
                ids += [drafts[:n], torch.full((len(masked),), req.mask_id)]
                positions += [torch.arange(start, start + n), masked]
                groups.append(torch.full((n + len(masked),), g))
                layout.append((n, masked))
            item, tokens = self.item(req, torch.cat(ids), torch.cat(positions), torch.cat(groups))
            items.append(item)
            processed.append(tokens)
            layouts.append(layout)
        out = []
        for (req, *_, ar_head), logits, layout, tokens in zip(
            calls, forward(self.decoder, items), layouts, processed, strict=True
        ):
            proposals, row, draws = [], 0, req.rng.draws  # logits [sum of the spans' tokens, V], span after span
            for n, masked in layout:
                rows = logits[row + n : row + n + len(masked)]
                if ar_head:
                    rows = torch.cat([logits[row + n - 1][None], rows[1:]])
                rng = req.rng.copy()
                proposals.append(propose_from_logits(masked, rows, req.sampling, rng, req.mask_id, self.decoder.ops))
                row, draws = row + n + len(masked), rng.draws
            out.append((proposals, draws, tokens))
        return out


def next_token_verdict(
    logits: torch.Tensor, draft: torch.Tensor, positions: torch.Tensor, top_n: int | None
) -> Verdict:
    """logits [L, V] of a forward over draft [L] at positions [L] -> the verdict on draft[1:]: token j + 1 under the
    distribution of the output at token j (a softmax over every token); with top_n, the drafts' logprobs and the top_n
    alternatives of each."""
    probs = torch.softmax(logits[:-1], -1).cpu()  # [L - 1, V]
    target_probs, target = probs.max(-1)
    draft_probs = probs.gather(-1, draft[1:, None]).squeeze(-1)
    verdict = Verdict(positions[1:], draft[1:], target, target[:, None], draft_probs, target_probs)
    if top_n is not None:
        top = torch.log_softmax(logits[:-1].float(), -1).cpu().topk(min(top_n, logits.shape[-1]), -1)
        verdict.logprobs = TokenLogprobs(draft_probs.log(), top.indices, top.values, verified=False)
    return verdict


def input_at(item: Item, position: int) -> int | None:
    """The index of the forward's input at a logical position id, if one stands there."""
    try:
        return item.position_ids.index(position)
    except ValueError:
        return None


def roll_back(cache: CausalCache, req: Request) -> None:
    """Keep the KV of the longest run of cached commits that the request still holds, in order and with the same
    tokens; drop the rest (a rejected speculative window's)."""
    n = cache.committed
    if req.order[:n] == cache.positions and req.tokens[cache.positions].tolist() == cache.tokens:
        return
    keep = 0
    for position, token, p in zip(cache.positions, cache.tokens, req.order, strict=False):
        if position != p or token != int(req.tokens[p]):
            break
        keep += 1
    drop_from(cache, req, keep)


def uncache(cache: CausalCache, req: Request, position: int) -> None:
    """Drop the cached commit at a generation position, and every later one, so that they run in the next forward
    again (an earlier forward cached the commit whose output the AR head reads: one whose round runs again)."""
    if position in cache.positions:
        drop_from(cache, req, cache.positions.index(position))


def drop_from(cache: CausalCache, req: Request, keep: int) -> None:
    """Keep the KV of the first `keep` cached commits (and the prompt's)."""
    truncate(cache.kv, req.prompt_len + keep)
    del cache.positions[keep:], cache.tokens[keep:]


def reuse_staged(cache: CausalCache, req: Request) -> None:
    """Move into the cache the staged KV of the commits made since it was staged, in commit order, as far as the
    staged entries hold them with the token they were computed from; the commits past that stay pending."""
    staged, cache.staged = cache.staged, None
    if staged is None or staged.order != cache.committed or staged.round + 1 != req.stats.rounds:
        return
    where = {p: i for i, p in enumerate(staged.positions)}
    take = []
    for p in req.order[cache.committed :]:
        i = where.get(p)
        if i is None or staged.ids[i] != int(req.tokens[p]):
            break  # e.g. a token the gate replaced after the forward: its KV, and every later commit's, is recomputed
        take.append(i)
    if take:
        append(cache.kv, staged.kv, torch.tensor(take))
        cache.add([staged.positions[i] for i in take], [staged.ids[i] for i in take])
