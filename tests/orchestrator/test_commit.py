"""EOS truncation and exact lengths, with a scripted proposer so the outcome is known in advance."""

import torch

from services.common.proposal import Region, propose_from_logits
from services.common.request import Request
from services.orchestrator.commit import Commit
from services.orchestrator.gate import Threshold
from services.orchestrator.loop import Rounds, one_round, run
from services.orchestrator.strategies import Stages

MASK, EOS, VOCAB = 1, 0, 50


class Scripted:
    """Proposes `script[pos]` with full confidence at every masked position of the region."""

    def __init__(self, script: list[int]):
        self.script = script

    def __call__(self, req: Request, region: Region):
        """A propose stage that needs no model call."""
        masked = (~req.decided[region.start : region.end]).nonzero().squeeze(-1) + region.start
        logits = torch.full((len(masked), VOCAB), -10.0)
        logits[torch.arange(len(masked)), torch.tensor([self.script[p] for p in masked.tolist()])] = 10.0
        return propose_from_logits(masked, logits, req.sampling, req.generator, req.mask_id)
        yield


def decode(script: list[int], n: int, commit: Commit) -> Request:
    req = Request("r", [3, 4], n, MASK, EOS)
    stages = Stages(Scripted(script), Threshold(0.5), commit)
    while not req.finished:
        run(Rounds({req.id: (req, one_round(req, stages))}), lambda groups, parents: {})
    return req


def test_eos_truncates():
    script = [7, 8, 9, EOS, 11, 12, 13, 14]
    for commit in (Commit("block", 4), Commit("window", 3), Commit("block", 4, order="slot")):
        req = decode(script, 8, commit)
        assert req.output_ids() == [7, 8, 9] and req.finish_reason == "eos"
        assert req.horizon == 4


def test_exactly_max_new_tokens_without_eos():
    req = decode(list(range(10, 30)), 13, Commit("block", 4))
    assert req.output_ids() == list(range(10, 23)) and req.finish_reason == "length"
    assert req.stats.rounds == 4  # one round per block: every proposal clears the threshold


def test_decided_token_never_changes():
    req = Request("r", [3], 4, MASK, EOS)
    req.decide(torch.tensor([1]), torch.tensor([9]))
    try:
        req.decide(torch.tensor([1]), torch.tensor([8]))
    except AssertionError:
        return
    raise AssertionError("re-deciding a position must fail")
