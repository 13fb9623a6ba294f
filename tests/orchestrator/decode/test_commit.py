"""EOS truncation (the default EOS policy; the others: test_eos_policies.py) and exact lengths, with a scripted
proposer so the outcome is known in advance."""

import torch

from services.common.proposal import Decision, Region, propose_from_logits
from services.common.request import Request
from services.orchestrator.decode.commit import Commit
from services.orchestrator.decode.gate import Threshold, runs
from services.orchestrator.decode.round import one_round
from services.orchestrator.decode.strategies import Stages

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
        return propose_from_logits(masked, logits, req.sampling, req.rng, req.mask_id)
        yield


def decode(script: list[int], n: int, commit: Commit) -> Request:
    req = Request("r", [3, 4], n, MASK, EOS)
    stages = Stages(Scripted(script), Threshold(0.5), commit)
    while not req.finished:
        assert list(one_round(req, stages)) == []  # a scripted proposer calls no model
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


def test_a_commits_fill_replaces_every_tentative_draft_even_with_none():
    """follow=guider keeps the filter's drafts past the agreement as context until the next commit replaces them."""
    req = Request("r", [3], 6, MASK, EOS)
    commit = Commit("frontier", 6)
    kept = Decision(torch.tensor([0]), torch.tensor([7]), torch.tensor([2, 3]), torch.tensor([8, 9]))
    commit(req, kept)
    assert req.tokens.tolist() == [7, MASK, 8, 9, MASK, MASK] and req.filled.tolist() == [0, 0, 1, 1, 0, 0]
    commit(req, Decision(torch.tensor([1]), torch.tensor([5])))
    assert req.tokens.tolist() == [7, 5] + [MASK] * 4 and not req.filled.any()


def test_slot_order_commits_slots_ahead_of_the_frontier_and_streams_them_as_spans():
    req = Request("r", [3, 4], 8, MASK, EOS)
    event = Commit("block", 8, order="slot")(req, Decision(torch.tensor([4, 5, 6]), torch.tensor([20, 21, 22])))
    assert req.order == [4, 5, 6] and event.ids == [] and event.spans == [(4, [20, 21, 22])]
    assert req.stats.first_commit_s is None  # nothing contiguous yet
    event = Commit("block", 8, order="slot")(req, Decision(torch.tensor([0, 1]), torch.tensor([10, 11])))
    assert req.order == [4, 5, 6, 0, 1] and event.ids == [10, 11] and event.spans == []
    assert req.stats.first_commit_s is not None
    prefix = Request("r", [3, 4], 8, MASK, EOS)
    Commit("block", 8)(prefix, Decision(torch.tensor([4, 5, 6]), torch.tensor([20, 21, 22])))
    assert prefix.order == []  # prefix order: only the contiguous decided prefix enters the cache


def test_spans_past_an_eos_are_not_streamed():
    req = Request("r", [3, 4], 8, MASK, EOS)
    event = Commit("block", 8, order="slot")(req, Decision(torch.tensor([2, 3, 4, 6]), torch.tensor([20, EOS, 22, 23])))
    assert req.horizon == 4 and event.spans == [(2, [20, EOS])]
    event = Commit("block", 8, order="slot")(req, Decision(torch.tensor([0, 1]), torch.tensor([10, 11])))
    assert event.finish_reason == "eos" and event.ids == [10, 11, 20, EOS]


def test_runs_split_sorted_positions():
    assert runs([0, 1, 2, 5, 6, 9]) == [[0, 1, 2], [5, 6], [9]]
    assert runs([3]) == [[3]] and runs([]) == []


def test_commit_rejects_unknown_regions_and_orders():
    for region, order in (("ring", "prefix"), ("block", "random")):
        try:
            Commit(region, 4, order)
        except ValueError:
            continue
        raise AssertionError(f"Commit({region!r}, order={order!r}) must fail")


def test_commit_rejects_unknown_eos_policies_and_eotp_outside_blocks():
    for region, eos in (("block", "stop"), ("window", "eotp")):
        try:
            Commit(region, 4, eos=eos)
        except ValueError:
            continue
        raise AssertionError(f"Commit({region!r}, eos={eos!r}) must fail")
