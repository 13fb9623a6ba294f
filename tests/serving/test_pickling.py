"""What crosses a Serve hop pickles compactly once services.serving.pickling is imported: tensors as numpy
arrays and the RNG as its two ints, under pickle and under Ray's cloudpickle alike."""

import pickle

import pytest
import torch

import services.serving.pickling  # noqa: F401  registers the reducers
from services.common.contract import AcceptProbs, Guessed, Propose, Reply, Verify
from services.common.proposal import Decision, Proposal, Region, TokenLogprob, TokenLogprobs, Verdict
from services.common.request import Request
from services.common.sampling import SamplingParams


def live_request() -> Request:
    req = Request("r1", [5, 6, 7], 16, mask_id=1, eos_id=0, sampling=SamplingParams(0.7, 0.9, seed=3))
    req.decide(torch.tensor([0, 1]), torch.tensor([11, 12]))
    req.fill(torch.tensor([4]), torch.tensor([13]))
    req.commit([0, 1])
    req.state["credits"] = [1.5]
    req.stats.add({"rounds": 2})
    req.rng.generator()  # the RNG has moved on from its seed
    return req


def assert_same_request(a: Request, b: Request, whole: bool = True) -> None:
    """whole: every field; else as a call's host gets it, with what only the engine reads empty."""
    for name in ("id", "prompt_ids", "max_new_tokens", "mask_id", "eos_id", "sampling", "horizon", "order", "rng"):
        assert getattr(a, name) == getattr(b, name), name
    assert (a.state, a.logprobs) == ((b.state, b.logprobs) if whole else ({}, {}))
    for name in ("tokens", "decided", "filled", "committed"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.stats.counters() == b.stats.counters()


@pytest.mark.parametrize("dumps", [pickle.dumps, "cloudpickle"])
def test_request_round_trips_compactly(dumps):
    if dumps == "cloudpickle":
        dumps = pytest.importorskip("ray.cloudpickle").dumps
    req = live_request()
    data = dumps(req)
    assert b"torch" not in data  # no tensor or storage reduce: numpy arrays
    assert_same_request(pickle.loads(data), req)


def test_the_rng_crosses_as_two_ints():
    seeded = live_request()
    greedy = Request("r1", [5, 6, 7], 16, mask_id=1, eos_id=0, sampling=SamplingParams(0.0, 0.9, seed=3))
    for req in (seeded, greedy):
        req.rng.draws = 12345
    sizes = [len(pickle.dumps(Propose(req, Region(0, 4)))) for req in (seeded, greedy)]
    assert sizes[0] - sizes[1] < 16  # the temperature's float, not a generator's 5 KB state
    assert pickle.loads(pickle.dumps(seeded.rng)) == seeded.rng


def test_a_calls_request_crosses_without_what_only_the_engine_reads():
    """Credit's scores ([block, V]) and the logprobs of every token so far stay with the engine; the cache index's
    record of the request (a whole pickle) keeps them."""
    req = live_request()
    req.state["credit"] = (0, torch.rand(32, 4096))  # 512 KB
    req.logprobs = {p: TokenLogprob(-0.1 * p, [(p, -0.1 * p), (9, -2.0)], True) for p in range(16)}
    for args in (Propose(req, Region(0, 4)), Verify(req, 0, torch.tensor([3, 4]), 1)):
        data = pickle.dumps(args)
        assert len(data) < 4_000  # the canvas
        assert_same_request(pickle.loads(data).req, req, whole=False)
    record = pickle.loads(pickle.dumps(req))
    assert torch.equal(record.state["credit"][1], req.state["credit"][1]) and record.logprobs == req.logprobs


def test_stage_values_round_trip_compactly():
    proposal = Proposal(torch.arange(3), torch.tensor([4, 5, 6]), torch.rand(3), torch.rand(3), None)
    verdict = Verdict(
        *(torch.arange(2) for _ in range(3)), torch.zeros(2, 4, dtype=torch.long), torch.rand(2), torch.rand(2)
    )
    decision = Decision(torch.tensor([0]), torch.tensor([9]))
    reply = Reply(proposal, 7, 5)
    data = pickle.dumps([proposal, verdict, decision, reply])
    assert b"torch" not in data
    p, v, d, r = pickle.loads(data)
    assert torch.equal(p.ids, proposal.ids) and p.logits is None
    assert torch.equal(v.topk, verdict.topk) and v.filter_scores is None
    assert torch.equal(d.fill_ids, decision.fill_ids) and torch.equal(d.ids, decision.ids)
    assert torch.equal(r.value.probs, proposal.probs) and (r.tokens, r.draws) == (7, 5)


def test_call_arguments_round_trip_compactly():
    """A batched call's typed arguments hold raw tensors (the guider's drafts, the filter's confidences)."""
    req = live_request()
    args = [Verify(req, 2, torch.tensor([60, 61, 62]), 3), AcceptProbs("causal", torch.rand(4))]
    data = pickle.dumps(args)
    assert b"torch" not in data
    verify, accept = pickle.loads(data)
    assert_same_request(verify.req, req, whole=False)
    assert (verify.start, verify.top_k, verify.method, accept.family) == (2, 3, "verify", "causal")
    assert torch.equal(verify.draft, args[0].draft) and torch.equal(accept.confidence, args[1].confidence)


def test_overlaps_guesses_cross_as_flat_arrays_and_come_back_whole():
    """propose_after's reply: each guess's proposal as it left, and the RNG's count of draws; far fewer bytes than a
    proposal object each, with no torch reduce. A proposal that carries logprobs crosses whole."""
    proposals = [
        Proposal(torch.arange(n, n + 16 - n), torch.arange(16 - n) + 40, torch.rand(16 - n), torch.rand(16 - n), None)
        for n in (1, 2, 5, 15)
    ]
    data = pickle.dumps(Reply(Guessed(proposals, 3), 7))
    assert b"torch" not in data and b"Proposal" not in data
    back = pickle.loads(data).value
    for got, sent in zip(back.proposals, proposals, strict=True):
        for name in ("positions", "ids", "probs", "entropy"):
            assert torch.equal(getattr(got, name), getattr(sent, name)), name
        assert got.logits is None and got.logprobs is None
    assert back.draws == 3
    chosen = TokenLogprobs(torch.zeros(1), torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2), verified=False)
    with_logprobs = Proposal(torch.arange(1), torch.arange(1), torch.ones(1), torch.zeros(1), None, chosen)
    back = pickle.loads(pickle.dumps(Guessed([with_logprobs], 0)))
    assert torch.equal(back.proposals[0].logprobs.chosen, chosen.chosen)
