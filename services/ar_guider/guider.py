"""AR guider: any causal LM sharing the drafter's tokenizer, KV-cached over the committed contiguous prefix.

One forward verifies a draft span: logits at the last committed token and at every draft token give the guider's
choice for each draft position given the drafts before it. The next forward trims
the cache back to the prefix that was accepted.
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from services.common.batch import Item, forward
from services.common.kv import truncate
from services.common.kv_manager import KVManager
from services.common.models import LoadedModel
from services.common.proposal import (
    TORCH_MATHS,
    LogitMaths,
    Proposal,
    Verdict,
    never_mask,
    propose_from_logits,
    token_logprobs,
)
from services.common.request import Request
from services.common.sampling import SamplingParams, choose

GREEDY = SamplingParams()


@dataclass(slots=True)
class GuiderCache:
    kv: DynamicCache
    ids: list[int]  # the tokens whose KV is in kv


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = (torch.tensor(a[:n]) != torch.tensor(b[:n])).nonzero()
    return int(diff[0]) if len(diff) else n


def new_cache() -> GuiderCache:
    return GuiderCache(DynamicCache(), [])


class Guider:
    def __init__(self, loaded: LoadedModel, kv: KVManager):
        self.loaded = loaded
        self.decoder = loaded.decoder
        self.kv = kv

    def item(self, req: Request, start: int, draft: torch.Tensor) -> Item:
        cache = self.kv.get(req, new_cache)
        seq = req.prompt_ids + req.tokens[:start].tolist()  # the sequence before the span
        # trim back to what is still the accepted prefix; the last token before the span must run again
        past = min(common_prefix(cache.ids, seq), len(seq) - 1)
        truncate(cache.kv, past)
        cache.ids = seq + draft.tolist()
        new = cache.ids[past:]
        # logits at the last token before the span and at every draft token
        wanted = slice(len(new) - len(draft) - 1, None)
        return Item(cache.kv, new, list(range(past, past + len(new))), len(new), wanted=wanted)

    def forward_batch(self, calls: list[tuple[Request, int, torch.Tensor]]) -> list[torch.Tensor]:
        """calls: (req, start, draft [M]) -> logits [M + 1, V] for generation positions start .. start + M, the mask
        token banned."""
        return [never_mask(out, req.mask_id) for out, (req, _, _) in zip(self.logits(calls), calls, strict=True)]

    def logits(self, calls: list[tuple[Request, int, torch.Tensor]]) -> list[torch.Tensor]:
        """forward_batch's logits, the mask token not banned."""
        return forward(self.decoder, [self.item(*call) for call in calls])

    def next_token_batch(self, calls: list[tuple[Request, int]]) -> list[Proposal]:
        """calls: (req, start) -> the proposal of each request's token at start, in one forward."""
        empty = torch.empty(0, dtype=torch.long)
        logits = self.logits([(req, start, empty) for req, start in calls])  # [1, V] each
        return [
            propose_from_logits(torch.tensor([start]), out, req.sampling, req.rng, req.mask_id, self.decoder.ops)
            for (req, start), out in zip(calls, logits, strict=True)
        ]

    def lookahead_batch(self, calls: list[tuple[Request, int, int]]) -> list[tuple[torch.Tensor, int]]:
        """calls: (req, start, k) -> the guider's greedy tokens [<= k] from start, as it decodes alone (ARPropose),
        stopping after an EOS, and the forwards that took: each forward is batched over the requests still going."""
        ids = [torch.empty(0, dtype=torch.long) for _ in calls]
        forwards = [0] * len(calls)
        while going := [
            i for i, (req, _, k) in enumerate(calls) if len(ids[i]) < k and req.eos_id not in ids[i][-1:].tolist()
        ]:
            logits = self.forward_batch([(calls[i][0], calls[i][1], ids[i]) for i in going])
            # [len(going)]: each request's next token, in one copy to the CPU, where a proposal's ids are
            chosen = choose(torch.stack([out[-1] for out in logits]), GREEDY, None).cpu()
            for i, token in zip(going, chosen, strict=True):
                ids[i] = torch.cat([ids[i], token[None]])
                forwards[i] += 1
        return list(zip(ids, forwards, strict=True))

    def verify_batch(self, calls: list[tuple[Request, int, torch.Tensor, int]]) -> list[Verdict]:
        """calls: (req, start, draft [M], top_k) -> the guider's verdict on each draft, in one forward."""
        logits = self.logits([call[:3] for call in calls])
        return [
            verdict(start, draft, out[: len(draft)], top_k, req.sampling.logprobs, req.mask_id, self.decoder.ops)
            for (req, start, draft, top_k), out in zip(calls, logits, strict=True)
        ]


def verdict(
    start: int,
    draft: torch.Tensor,
    logits: torch.Tensor,
    top_k: int,
    top_n: int | None,
    mask_id: int,
    maths: LogitMaths = TORCH_MATHS,
) -> Verdict:
    """logits [M, V] predicting each draft position, the mask token not yet banned -> the guider's verdict on draft
    [M]; with top_n, the logprobs of the drafts and of the guider's own choices (top_n alternatives each), not the
    whole distribution."""
    target, target_probs, draft_probs = (t.cpu() for t in maths.verdict_stats(logits, draft, mask_id))
    positions = torch.arange(start, start + len(draft))
    banned = never_mask(logits, mask_id) if top_k > 1 or top_n is not None else None  # where read whole
    topk = target[:, None]  # the top 1 is the first maximum
    if top_k > 1:
        topk = torch.softmax(banned, -1).topk(top_k, -1).indices.cpu()
    out = Verdict(positions, draft, target, topk, draft_probs, target_probs)
    if top_n is not None:
        logp = torch.log_softmax(banned.float(), -1)
        out.logprobs = token_logprobs(logp, draft, top_n, verified=True)
        out.target_logprobs = logp.max(-1).values.cpu()
    return out
