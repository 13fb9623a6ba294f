"""AR guider: any causal LM sharing the drafter's tokenizer, KV-cached over the committed contiguous prefix.

One forward verifies a draft span: logits at the last committed token and at every draft token give the guider's
choice for each draft position given the drafts before it. The next forward trims
the cache back to the prefix that was accepted.
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from services.common.kv import truncate
from services.common.models import LoadedModel
from services.common.proposal import Verdict, never_mask
from services.common.request import Request


@dataclass(slots=True)
class GuiderCache:
    kv: DynamicCache
    ids: list[int]  # the tokens whose KV is in kv


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = (torch.tensor(a[:n]) != torch.tensor(b[:n])).nonzero()
    return int(diff[0]) if len(diff) else n


class Guider:
    def __init__(self, loaded: LoadedModel, role: str = "guider"):
        self.loaded = loaded
        self.model = loaded.model
        self.role = role  # which stats counter its forwards go to
        self.caches: dict[str, GuiderCache] = {}

    @torch.inference_mode()
    def forward(self, req: Request, start: int, draft: torch.Tensor) -> torch.Tensor:
        """Logits [M + 1, V] for generation positions start .. start + M given the decided prefix and draft [M]."""
        cache = self.caches.setdefault(req.id, GuiderCache(DynamicCache(), []))
        end = req.prompt_len + start  # the sequence before the span
        seq = req.prompt_ids + req.tokens[:start].tolist()
        # trim back to what is still the accepted prefix; the last token before the span must run again
        past = min(common_prefix(cache.ids, seq), end - 1)
        truncate(cache.kv, past)
        cache.ids = seq[:past] + seq[past:end] + draft.tolist()
        input_ids = torch.tensor(cache.ids[past:], device=self.model.device)[None]
        out = self.model(
            input_ids=input_ids,
            position_ids=torch.arange(past, past + input_ids.shape[1], device=self.model.device)[None],
            attention_mask=torch.ones(1, past + input_ids.shape[1], dtype=torch.long, device=self.model.device),
            past_key_values=cache.kv,
            use_cache=True,
        )
        setattr(req.stats, f"{self.role}_forwards", getattr(req.stats, f"{self.role}_forwards") + 1)
        return never_mask(out.logits[0, end - past - 1 :].float(), req.mask_id)

    def verify(self, req: Request, start: int, draft: torch.Tensor, top_k: int) -> Verdict:
        logits = self.forward(req, start, draft)[: len(draft)]  # [M, V]
        probs = torch.softmax(logits, -1).cpu()
        target_probs, target = probs.max(-1)
        positions = torch.arange(start, start + len(draft))
        draft_probs = probs.gather(-1, draft[:, None]).squeeze(-1)
        return Verdict(positions, draft, target, probs.topk(top_k, -1).indices, draft_probs, target_probs)

    def release(self, request_id: str) -> None:
        self.caches.pop(request_id, None)
