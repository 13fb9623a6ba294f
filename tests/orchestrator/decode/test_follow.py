"""`guided` and `pipeline` in their two modes, on scripted models, against FlashDLM's Algorithm 1 written out here.

follow=drafter (003 Alg. 1): the run of drafts the guider agrees with is unmasked with the drafter's tokens, and where
nothing agrees the first masked position takes the drafter's token; in `pipeline` the drafts the Learn2PD filter keeps
count as agreeing. follow=guider: speculative decoding of the guider, whose greedy decode is the output. On the causal
drafter the first masked position is drafted by its next-token head (frontier_head=ar) or by its mask (=mask).
"""

from collections.abc import Callable

import pytest
import torch

from services.common.request import Request
from services.common.sampling import SamplingParams
from tests.orchestrator.decode.test_scripted_strategies import IdentityFilter
from tests.scripted import MASK, ScriptedLM, confident, row, scripted_engine

PROMPT = [5, 6, 7]
N = 16
GUIDER = list(range(10, 26))
OTHER = [t - 8 for t in GUIDER]  # 2 .. 17: a different token at every position
GUIDED = [("guided", {"block_size": 8}, "bidirectional"), ("guided", {"block_size": 8, "drafter": "causal"}, "causal")]
BOTH = [*GUIDED, ("pipeline", {"window": 8}, "causal")]


class ShiftingLM(ScriptedLM):
    """A scripted model whose script changes with every forward: scripts[f] at its f-th forward (the last one after)."""

    def __init__(self, scripts: list[dict], prompt_len: int, bidirectional: bool = False):
        super().__init__(scripts[0], prompt_len, bidirectional)
        self.tables = [ScriptedLM(s, prompt_len).table for s in scripts]

    def decode(self, *args):
        self.table = self.tables[min(len(self.inputs), len(self.tables) - 1)]
        return super().decode(*args)


Top1 = Callable[[int, int], int]  # (position, round) -> the drafter's top-1
Conf = Callable[[int, int], float]  # (position, round) -> its probability


def drafter_model(top1: Top1, conf: Conf, family: str, rounds: int = N + 1) -> ShiftingLM:
    """One drafter forward per round in both strategies, so round f reads script f."""
    scripts = [{p: row({top1(p, f): conf(p, f)}) for p in range(N)} for f in range(rounds)]
    return ShiftingLM(scripts, len(PROMPT), bidirectional=family == "bidirectional")


def engine_with(drafter: ScriptedLM, family: str, guider: list[int] = GUIDER, filter_model=None):
    role = "drafter" if family == "causal" else "drafter_bidirectional"
    guider_model = ScriptedLM(confident(guider), len(PROMPT))
    return scripted_engine({role: drafter, "guider": guider_model}, N, {"causal": filter_model or IdentityFilter()})


def decode(engine, strategy: str, params: dict, sampling: SamplingParams | None = None) -> tuple[Request, list]:
    req = engine.request(PROMPT, N, sampling)
    events = list(engine.stream(req, strategy, params))
    return req, events


def algorithm1(top1: Top1, conf: Conf, chunk: int, keep: float | None = None) -> tuple[list[int], list[int]]:
    """003 Alg. 1 with the scripted guider (GUIDER, whatever the context) verifying `chunk` positions from the first
    masked one; the drafter drafts every masked position of the chunk, top1(p, f) in round f. The run of positions
    agreeing (pipeline: or kept by the filter, score = probability > keep) is unmasked with the drafts; with no run,
    the first masked position. -> output, tokens decided per round."""
    tokens: dict[int, int] = {}
    per_round = []
    while len(tokens) < N:
        f = len(per_round)
        frontier = min(set(range(N)) - set(tokens))
        span = range(frontier, min(frontier + chunk, N))
        drafts = {p: top1(p, f) for p in span}
        kept = {p for p in drafts if keep is not None and conf(p, f) > keep}
        run = []
        for p in span:
            if p not in kept and drafts[p] != GUIDER[p]:
                break
            run.append(p)
        take = set(run) or {frontier}
        tokens |= {p: drafts[p] for p in take}
        per_round.append(len(take))
    return [tokens[p] for p in range(N)], per_round


@pytest.mark.parametrize("strategy,params,family", BOTH)
def test_a_drafter_disagreeing_everywhere_gives_its_own_tokens_one_a_round_or_the_guiders(strategy, params, family):
    """p 0.9 stays under the filter's 0.99: the pipeline's filter keeps nothing."""
    engine = engine_with(ScriptedLM(confident(OTHER, 0.9), len(PROMPT), family == "bidirectional"), family)
    drafter, _ = decode(engine, strategy, {**params, "follow": "drafter"})
    assert drafter.output_ids() == OTHER and drafter.stats.accepted == [1] * N
    guider, _ = decode(engine, strategy, {**params, "follow": "guider"})
    assert guider.output_ids() == GUIDER


def shifting_top1(p: int, f: int) -> int:
    """Agrees with the guider except where (p + f) % 3 == 0: the drafter changes its mind between rounds."""
    return GUIDER[p] if (p + f) % 3 else OTHER[p]


def shifting_conf(p: int, f: int) -> float:
    return 0.995 if (p + 2 * f) % 5 == 0 else 0.9  # some drafts clear the filter's 0.99


@pytest.mark.parametrize("strategy,params,family", BOTH)
def test_follow_drafter_decides_each_token_as_the_drafters_top1_of_its_round(strategy, params, family):
    engine = engine_with(drafter_model(shifting_top1, shifting_conf, family), family)
    req, _ = decode(engine, strategy, {**params, "follow": "drafter"})
    keep = 0.99 if strategy == "pipeline" else None
    chunk = params.get("window", params.get("block_size"))
    ids, per_round = algorithm1(shifting_top1, shifting_conf, chunk, keep)
    assert req.output_ids() == ids and req.stats.accepted == per_round
    assert ids != GUIDER  # the drafter's tokens, not the guider's


def test_guided_acceptance_crosses_block_ends():
    """block_size is 003 Table 11's speculation block: the guider checks that many drafts from the frontier. Blocks of
    8 would stop the third round at position 8 (1 token, then 8)."""
    drafts = GUIDER[:6] + [OTHER[6]] + GUIDER[7:]
    engine = engine_with(ScriptedLM(confident(drafts), len(PROMPT), bidirectional=True), "bidirectional")
    req, _ = decode(engine, "guided", {"block_size": 8})
    ids, per_round = algorithm1(lambda p, f: drafts[p], lambda p, f: 0.99, 8)
    assert per_round == [6, 1, 8, 1]
    assert req.output_ids() == ids == drafts and req.stats.accepted == per_round


@pytest.mark.parametrize("strategy,params,family", BOTH)
def test_logprobs_are_the_drafters_for_drafter_tokens_and_the_guiders_when_it_leads(strategy, params, family):
    """The drafter is sure at 0.9 and the guider at 0.99 (scripts' probability of their tokens)."""
    engine = engine_with(ScriptedLM(confident(OTHER, 0.9), len(PROMPT), family == "bidirectional"), family)
    for follow, p, verified in (("drafter", 0.9, False), ("guider", 0.99, True)):
        _, events = decode(engine, strategy, {**params, "follow": follow}, SamplingParams(logprobs=1))
        logprobs = [lp for e in events for lp in e.logprobs]
        assert len(logprobs) == N
        assert all(lp.logprob == pytest.approx(torch.tensor(p).log().item(), abs=1e-5) for lp in logprobs)
        assert all(lp.verified == verified for lp in logprobs)


# ---------------------------------------------------------------- the drafts the pipeline's filter keeps

AGREES = GUIDER[:3] + [OTHER[3]] + GUIDER[4:]  # the guider rejects position 3 only


def first_two_forwards(follow: str) -> tuple[ScriptedLM, Request]:
    """Round 1's drafts 0..7 are all above the filter's threshold but position 3's (0.9)."""
    script = confident(AGREES, 0.995)
    script[3] = row({AGREES[3]: 0.9})
    drafter = ScriptedLM(script, len(PROMPT))
    req, _ = decode(engine_with(drafter, "causal"), "pipeline", {"window": 8, "follow": follow})
    return drafter, req


def test_pipeline_follow_guider_keeps_the_filtered_drafts_as_context_for_the_next_forward():
    """Round 1 decides 0..2 and the guider's bonus token at 3; drafts 4..7, kept (0.995 > 0.99), stand in the next
    forward before its masks, as clean context, behind the commits."""
    drafter, req = first_two_forwards("guider")
    assert req.output_ids() == GUIDER
    ids, segments = drafter.calls[1]
    positions, _ = drafter.positions[1]
    expected = [(t, len(PROMPT) + p) for p, t in enumerate(GUIDER[:4] + AGREES[4:8])]
    expected += [(MASK, len(PROMPT) + p) for p in range(8, 12)]
    assert list(zip(ids[0].tolist(), positions, strict=True)) == expected


@pytest.mark.parametrize("confidence_at_3,decided", [(0.9, [0, 1, 2]), (0.995, list(range(8)))])
def test_pipeline_follow_drafter_filter_extends_the_agreeing_run_and_decides_nothing_past_it(confidence_at_3, decided):
    """Position 3 is rejected by the guider. Under the filter's threshold it ends the run: 0..2 are decided and the
    kept drafts 4..7 past it are not (the next forward masks 3..10 behind the commits). Kept, it counts as agreeing:
    0..7 are decided, 3 as the drafter's token."""
    script = confident(AGREES)
    script[3] = row({AGREES[3]: confidence_at_3})
    drafter = ScriptedLM(script, len(PROMPT))
    req, _ = decode(engine_with(drafter, "causal"), "pipeline", {"window": 8, "follow": "drafter"})
    assert req.output_ids() == AGREES and req.stats.accepted[0] == len(decided)
    ids, _ = drafter.calls[1]
    positions, _ = drafter.positions[1]
    frontier = len(decided)
    expected = [(AGREES[p], len(PROMPT) + p) for p in decided]
    expected += [(MASK, len(PROMPT) + p) for p in range(frontier, frontier + 8)]
    assert list(zip(ids[0].tolist(), positions, strict=True)) == expected


# ---------------------------------------------------------------- the causal drafter's frontier head

NEXT = [2 + (p + 20) % 30 for p in range(N)]  # what its next-token head says: neither OTHER's nor GUIDER's token


@pytest.mark.parametrize("strategy,params", [(s, p) for s, p, family in BOTH if family == "causal"])
@pytest.mark.parametrize("frontier_head,expected", [("ar", NEXT), ("mask", OTHER)])
def test_the_frontier_draft_comes_from_the_drafters_next_token_head_or_its_mask(
    strategy, params, frontier_head, expected
):
    """Masks predict OTHER and clean tokens predict NEXT of the position after them: with nothing agreeing, each
    round decides the frontier's draft, from the clean token before it (the drafter's left-to-right decode) or from
    its mask. Following the guider, the output is the guider's either way."""
    drafter = ScriptedLM(confident(OTHER, 0.9), len(PROMPT), next_script=confident(NEXT, 0.9))
    engine = engine_with(drafter, "causal")
    req, _ = decode(engine, strategy, {**params, "follow": "drafter", "frontier_head": frontier_head})
    assert req.output_ids() == expected and req.stats.accepted == [1] * N
    guider, _ = decode(engine, strategy, {**params, "follow": "guider", "frontier_head": frontier_head})
    assert guider.output_ids() == GUIDER
