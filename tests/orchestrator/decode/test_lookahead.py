"""pipeline with follow=guider and lookahead=k (decode/lookahead.py): the guider's own next k tokens, decoded while
the drafter drafts, stand in front of the drafts. Against speculative decoding with that lookahead written out here,
on scripted models: the output is the guider's greedy decode, and each round decides the guider's k tokens, the
drafts after them that it agrees with, and its token at the first disagreement."""

import pytest
import torch

from services.common.proposal import Proposal
from services.common.sampling import SamplingParams
from services.orchestrator.decode.lookahead import with_tokens
from services.orchestrator.decode.strategies import make_params
from services.orchestrator.engine.engine import Engine
from tests.orchestrator.decode.test_follow import GUIDER, OTHER, PROMPT, N, engine_with
from tests.scripted import EOS, ScriptedLM, row

WINDOW = 6


def drafter(agrees: set[int]) -> ScriptedLM:
    """Drafts the guider's token at the positions in `agrees`, another token elsewhere."""
    script = {p: row({GUIDER[p] if p in agrees else OTHER[p]: 0.9}) for p in range(N)}
    return ScriptedLM(script, len(PROMPT))


def reference(agrees: set[int], k: int) -> list[int]:
    """Speculative decoding of the guider (whose token at p is GUIDER[p]) over windows of WINDOW drafts from the
    frontier, the first k of them the guider's own: the agreeing run is decided, and the guider's token at the first
    disagreement. -> tokens decided per round."""
    per_round, frontier = [], 0
    while frontier < N:
        span = range(frontier, min(frontier + WINDOW, N))
        run = 0
        for i, p in enumerate(span):
            if i >= k and p not in agrees:
                break
            run += 1
        decided = min(run + 1, len(span))
        per_round.append(decided)
        frontier += decided
    return per_round


def decode(
    agrees: set[int], k: int, sampling: SamplingParams | None = None, requests: int = 1, guider: list[int] = GUIDER
):
    model = drafter(agrees)
    engine = engine_with(model, "causal", guider)
    reqs = [engine.request(PROMPT, N, sampling or SamplingParams(), request_id=f"r{i}") for i in range(requests)]
    for req in reqs:
        engine.add(req, "pipeline", {"window": WINDOW, "follow": "guider", "lookahead": k})
    while engine.has_unfinished():
        engine.step()
    return reqs


AGREES = [set(), {3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, set(range(N)) - {2, 9}]


@pytest.mark.parametrize("agrees", AGREES, ids=["never", "middle", "mostly"])
@pytest.mark.parametrize("k", [0, 1, 3, WINDOW])
def test_each_round_decides_the_guiders_k_tokens_then_the_agreeing_drafts_and_its_own(agrees, k):
    (req,) = decode(agrees, k)
    assert req.tokens.tolist() == GUIDER
    assert req.stats.accepted == reference(agrees, k)


@pytest.mark.parametrize("requests", [1, 3])
def test_the_guiders_lookahead_forwards_are_counted(requests):
    """Each round: one verify forward, and one lookahead forward per token the guider decided ahead."""
    for req in decode(set(), 3, requests=requests):
        ahead = [min(3, N - sum(req.stats.accepted[:r])) for r in range(req.stats.rounds)]
        assert req.stats.guider_forwards == req.stats.rounds + sum(ahead)


def test_the_guider_stops_its_lookahead_at_its_eos():
    """Its EOS at position 5: round 1 decides 0..3 (three ahead, then its token at the drafter's disagreement), round
    2 looks ahead from 4 and stops after the EOS at 5: two forwards, not three."""
    ending = GUIDER[:5] + [EOS] + GUIDER[6:]
    (req,) = decode(set(), 3, guider=ending)
    assert req.output_ids() == GUIDER[:5] and req.finish_reason == "eos"
    assert (req.stats.rounds, req.stats.guider_forwards) == (2, 2 + 3 + 2)


def test_a_seeded_drafter_changes_nothing_of_the_output():
    """The drafter samples its drafts; the output is the guider's greedy decode, with or without lookahead."""
    seeded = SamplingParams(temperature=1.0, seed=5)
    for k in (0, 2):
        (req,) = decode(set(range(N)), k, seeded, requests=1)
        assert req.tokens.tolist() == GUIDER


def test_the_guiders_tokens_replace_drafts_and_join_tentative_ones():
    """Positions 1..2 were masked (drafted), 0 held a tentative draft (not in the proposal): all three take the
    guider's tokens, certain; the drafts after them stay as they were."""
    proposal = Proposal(torch.arange(1, 5), torch.tensor([11, 12, 13, 14]), torch.full((4,), 0.5), torch.ones(4), None)
    merged = with_tokens(proposal, torch.arange(0, 3), torch.tensor([90, 91, 92]))
    assert merged.positions.tolist() == [0, 1, 2, 3, 4]
    assert merged.ids.tolist() == [90, 91, 92, 13, 14]
    assert merged.probs.tolist() == [1.0, 1.0, 1.0, 0.5, 0.5]
    assert merged.entropy.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "params", [{"lookahead": 2}, {"lookahead": 2, "follow": "guider", "overlap": True}, {"lookahead": -1}]
)
def test_lookahead_is_refused_where_the_guiders_tokens_are_not_the_output_or_with_overlap(params):
    with pytest.raises(ValueError, match="lookahead"):
        make_params("pipeline", params)


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=7)], ids=["greedy", "seeded"]
)
def test_lookahead_on_the_tiny_zoo_gives_the_guider_alones_decode(engine: Engine, sampling):
    """Real models: the lookahead forwards extend the guider's cache one token at a time, and the verify forward
    trims it back to the frontier."""
    prompt = "count from 1 to 9:"
    alone = engine.generate(prompt, "ar", {"model": "guider"}, max_new_tokens=24)
    for k in (1, 3):
        ahead = engine.generate(prompt, "pipeline", {"follow": "guider", "lookahead": k}, 24, sampling)
        assert ahead.token_ids == alone.token_ids
