"""pipeline with overlap=true (decode/overlap.py: the next window drafted while the guider verifies this one) gives
token for token what overlap=false gives, greedy and seeded, following the drafter or the guider, one request or
several at once; a speculative window is taken when its round starts from the request it assumed, and only then."""

import pytest
import torch

from services.common.proposal import Proposal, Region
from services.common.request import Request
from services.common.sampling import SamplingParams
from services.orchestrator.decode.commit import Commit
from services.orchestrator.decode.overlap import Speculation, accepted, guess_counts
from services.orchestrator.decode.strategies import make_params
from services.orchestrator.engine.engine import Engine
from tests.orchestrator.decode.test_follow import GUIDER, OTHER, PROMPT, N, engine_with
from tests.orchestrator.decode.test_scripted_strategies import IdentityFilter
from tests.scripted import MASK, ScriptedLM, row, scripted_engine

SAMPLINGS = [SamplingParams(), SamplingParams(temperature=1.0, seed=4)]
IDS = ["greedy", "seeded"]


def drafter(confidence: float = 0.99) -> ScriptedLM:
    """The guider's tokens everywhere but position 5, which it rejects: the first round's speculation fails, the
    second's holds."""
    script = {p: row({OTHER[p] if p == 5 else GUIDER[p]: 0.9 if p == 5 else confidence}) for p in range(N)}
    return ScriptedLM(script, len(PROMPT))


def decode(
    model: ScriptedLM,
    overlap: bool,
    follow: str,
    sampling: SamplingParams,
    requests: int = 1,
    window: int = 8,
    head: str = "ar",
    guesses: int = 1,
):
    engine = engine_with(model, "causal")
    reqs = [engine.request(PROMPT, N, sampling, request_id=f"r{i}") for i in range(requests)]
    params = {"window": window, "follow": follow, "overlap": overlap, "frontier_head": head}
    if guesses > 1:
        params["guesses"] = guesses
    for req in reqs:
        engine.add(req, "pipeline", params)
    while engine.has_unfinished():
        engine.step()
    return [(req.tokens.tolist(), req.stats.rounds) for req in reqs]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
@pytest.mark.parametrize(("follow", "guesses"), [("drafter", 1), ("drafter", 2), ("drafter", 8), ("guider", 1)])
@pytest.mark.parametrize("requests", [1, 3])
@pytest.mark.parametrize("head", ["ar", "mask"])
def test_overlap_gives_the_tokens_of_no_overlap(follow, guesses, sampling, requests, head):
    # 0.5: the seeded drafter samples other tokens than its top-1; window 4: speculations taken with rounds after them
    for confidence, window in [(0.99, 8), (0.5, 8), (0.99, 4), (0.5, 4)]:
        off = decode(drafter(confidence), False, follow, sampling, requests, window, head)
        assert decode(drafter(confidence), True, follow, sampling, requests, window, head, guesses) == off


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
def test_with_every_count_guessed_each_round_after_the_first_takes_its_speculation(sampling):
    """Rounds accepting 5, 1, 8 and 2 drafts: guessing every count, each round after the first takes the proposal
    drafted beside the previous round's verify, so the drafter runs one forward a round (and the first round's
    propose); guessing the whole window alone, the rounds after a shorter acceptance propose anew."""
    forwards = []
    for guesses in (1, 8):
        model, off = drafter(), decode(drafter(), False, "drafter", sampling)
        assert decode(model, True, "drafter", sampling, guesses=guesses) == off
        forwards.append(len(model.inputs))
    assert forwards == [6, 5]


def test_the_counts_guessed_are_the_whole_window_then_the_likeliest():
    """Reference: each draft accepted with its drafter probability, the run of accepted drafts is k long with
    probability p_1 ... p_k (1 - p_k+1), and a round accepts max(k, 1)."""
    probs = torch.tensor([0.9, 0.9, 0.1, 0.9])
    exact = {1: 0.1 + 0.9 * 0.1, 2: 0.81 * 0.9, 3: 0.081 * 0.1, 4: 0.081 * 0.9}  # count -> its probability
    ranked = [4] + sorted((1, 2, 3), key=lambda n: -exact[n])
    assert ranked == [4, 2, 1, 3]
    for guesses in range(1, 5):
        assert guess_counts(probs, guesses) == ranked[:guesses]
    # a run of none accepts one draft too: count 1 is likelier than 2 here only with the empty run counted in
    unsure_first = torch.tensor([0.5, 0.99, 0.5, 0.5])  # count 1: 0.5 + 0.005, 2: 0.2475, 3: 0.12375
    assert guess_counts(unsure_first, 4) == [4, 1, 2, 3]


@pytest.mark.parametrize("params", [{"guesses": 2}, {"guesses": 2, "overlap": True, "follow": "guider"}])
def test_guesses_need_overlap_and_follow_drafter(params):
    with pytest.raises(ValueError, match="guesses > 1 needs overlap=true and follow=drafter"):
        make_params("pipeline", params)


@pytest.mark.parametrize("follow", ["drafter", "guider"])
def test_a_speculative_window_is_taken_only_when_its_round_starts_where_it_assumed(follow):
    off, on = drafter(), drafter()  # the mask's own output drafts every position, the frontier's too
    decode(off, False, follow, SamplingParams(), head="mask")
    decode(on, True, follow, SamplingParams(), head="mask")
    # follow=guider, three rounds: round 1 speculates on round 2 (rejected: position 5) and round 2 on round 3 (taken).
    # follow=drafter, four: round 2 decides the drafter's token at 5 alone, so its speculation fails too.
    assert (len(off.inputs), len(on.inputs)) == {"guider": (3, 4), "drafter": (4, 6)}[follow]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
def test_overlap_on_the_tiny_zoo_gives_the_tokens_of_no_overlap(engine: Engine, sampling):
    """Real models: the causal drafter's cache rolls back the rejected speculative windows."""
    prompt = "count from 1 to 9:"
    off = engine.generate(prompt, "pipeline", {"overlap": False}, max_new_tokens=24, sampling=sampling)
    on = engine.generate(prompt, "pipeline", {"overlap": True}, max_new_tokens=24, sampling=sampling)
    assert on.token_ids == off.token_ids


def sixteen(engine: Engine, overlap: bool) -> list[list[int]]:
    """16 requests decoded at once, greedy and seeded in turn, on two prompts -> their tokens."""
    prompts = ["count from 1 to 9:", "the capital of France is"]
    samplings = [SamplingParams() if i % 2 else SamplingParams(temperature=0.8, seed=300 + i) for i in range(16)]
    params = {"overlap": overlap}
    reqs = [engine.add_request(prompts[i % 2], "pipeline", params, 24, s) for i, s in enumerate(samplings)]
    while engine.has_unfinished():
        engine.step()
    return [req.output_ids() for req in reqs]


def test_sixteen_requests_at_once_with_overlap_give_the_tokens_of_no_overlap(engine: Engine):
    """c=16 on the tiny zoo: one step's speculative proposals batched with the guider's calls for every request."""
    assert sixteen(engine, overlap=True) == sixteen(engine, overlap=False)


def test_a_taken_speculation_hands_on_the_rng_it_drew_from():
    """Two equally likely tokens at every position, both in the guider's top 2: every window is accepted whatever the
    seeded drafter draws, so every speculation is taken and each round's draws follow the previous one's."""
    two = {p: row({GUIDER[p]: 0.5, OTHER[p]: 0.49}) for p in range(N)}
    tokens = []
    for overlap in (False, True):
        engine = scripted_engine(
            {"drafter": ScriptedLM(two, len(PROMPT)), "guider": ScriptedLM(two, len(PROMPT))},
            N,
            {"causal": IdentityFilter()},
        )
        req = engine.request(PROMPT, N, SamplingParams(temperature=1.0, seed=11))
        engine.add(req, "pipeline", {"window": 4, "top_k_match": 2, "overlap": overlap})
        while engine.has_unfinished():
            engine.step()
        tokens.append(req.tokens.tolist())
    assert tokens[0] == tokens[1] and len(set(tokens[0]) & set(OTHER)) > 2  # the draws matter


def test_a_speculation_holds_only_for_the_request_it_assumed():
    req = Request("r", PROMPT, N, MASK, 0)
    region, commit = Region(0, 4), Commit("frontier", 4)
    proposal = Proposal(torch.arange(4), torch.tensor(GUIDER[:4]), torch.ones(4), torch.zeros(4), None)
    speculation = Speculation(accepted(req, region, proposal, commit, 4), Region(4, 8), proposal, req.rng.draws)
    assert speculation.holds(accepted(req, region, proposal, commit, 4), Region(4, 8))
    other = Proposal(torch.arange(4), torch.tensor(GUIDER[:3] + [OTHER[3]]), torch.ones(4), torch.zeros(4), None)
    # the same commits, one token not
    assert not speculation.holds(accepted(req, region, other, commit, 4), Region(4, 8))
    assert not speculation.holds(accepted(req, Region(0, 3), proposal, commit, 3), Region(3, 7))
    assert not speculation.holds(accepted(req, region, proposal, commit, 4), Region(4, 7))
