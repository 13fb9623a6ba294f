"""The guider's KV cache across verifies, against uncached forwards: a verify trims the cache back to the accepted
prefix, by a single entry when every draft was accepted (the last token before the span runs again)."""

import torch

from services.ar_guider.guider import Guider
from services.common.kv_manager import KVManager
from services.common.models import load_model
from services.common.request import Request


def uncached(guider: Guider, req: Request, start: int, draft: torch.Tensor) -> torch.Tensor:
    """Logits [M, V] predicting each draft position, from one forward over prompt + decided prefix + draft; the mask
    token is never an output."""
    seq = torch.tensor(req.prompt_ids + req.tokens[:start].tolist() + draft.tolist())[None]
    logits = guider.loaded.model(input_ids=seq).logits[0].float()
    logits[:, req.mask_id] = float("-inf")
    return logits[len(seq[0]) - len(draft) - 1 : -1]


def test_verifies_after_full_and_partial_acceptance_equal_uncached_forwards(tiny_zoo):
    guider = Guider(load_model(tiny_zoo["guider"]), KVManager())
    req = Request("r", [5, 9, 11, 7], 24, guider.loaded.mask_id, guider.loaded.eos_id)
    g = torch.Generator().manual_seed(0)
    start = 0
    for accepted in (4, 4, 1, 3, 0, 4):  # all four drafts (the cache is cut by one entry), or fewer
        draft = torch.randint(20, 200, (4,), generator=g)
        verdict = guider.verify_batch([(req, start, draft, 2)])[0]
        probs = torch.softmax(uncached(guider, req, start, draft), -1)
        torch.testing.assert_close(verdict.draft_probs, probs.gather(-1, draft[:, None]).squeeze(-1), atol=1e-5, rtol=0)
        assert verdict.target.tolist() == probs.argmax(-1).tolist()
        ids = torch.cat([draft[:accepted], verdict.target[accepted : accepted + 1]])  # the guider's bonus token
        req.decide(torch.arange(start, start + len(ids)), ids)
        start += len(ids)
