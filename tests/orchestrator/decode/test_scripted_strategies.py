"""Whole decodes on scripted models: parallel acceptance shows exactly where the script makes tokens confident."""

import pytest
import torch

from services.common.proposal import Proposal, Region
from services.common.request import Request
from services.filter.model import FilterConfig
from services.orchestrator.decode.verify import filter_call, proposal_scores
from tests.orchestrator.decode.test_gates import bisect_reference
from tests.scripted import MASK, ScriptedLM, confident, row, scripted_engine

PROMPT = [5, 6, 7]
TOKENS = list(range(10, 26))  # 16 tokens, no EOS
GUIDER = list(range(10, 26))


def drafter_engine(script: dict, family: str, n: int = 16, filter_model=None, **others):
    role = "drafter" if family == "causal" else "drafter_bidirectional"
    model = ScriptedLM(script, len(PROMPT), bidirectional=family == "bidirectional")
    filters = {family: filter_model} if filter_model is not None else None
    return scripted_engine({role: model, **others}, n, filters), model


def run(engine, strategy: str, params: dict) -> Request:
    req = engine.request(PROMPT)
    list(engine.stream(req, strategy, params))
    return req


FAMILIES = [("causal", "none"), ("bidirectional", "none"), ("bidirectional", "prefix"), ("bidirectional", "dual")]
FAMILIES += [("bidirectional", "freecache")]


@pytest.mark.parametrize("family,cache", FAMILIES)
def test_threshold_decides_a_confident_block_in_one_round(family, cache):
    engine, _ = drafter_engine(confident(TOKENS), family)
    req = run(engine, "threshold", {"drafter": family, "cache": cache, "block_size": 8})
    assert req.output_ids() == TOKENS and req.stats.accepted == [8, 8]


@pytest.mark.parametrize("family", ["causal", "bidirectional"])
def test_threshold_waits_for_an_uncertain_token(family):
    script = confident(TOKENS)
    script[3] = row({TOKENS[3]: 0.6, 2: 0.3})
    engine, _ = drafter_engine(script, family)
    req = run(engine, "threshold", {"drafter": family, "block_size": 8, "threshold": 0.9})
    assert req.output_ids() == TOKENS and req.stats.accepted == [7, 1, 8]


def test_mdm_decides_block_over_steps():
    engine, _ = drafter_engine(confident(TOKENS), "bidirectional")
    req = run(engine, "mdm", {"block_size": 8, "steps_per_block": 4})
    assert req.output_ids() == TOKENS and req.stats.accepted == [2] * 8


def test_hierarchical_bisects_each_block():
    engine, _ = drafter_engine({i: row({t: 0.7}) for i, t in enumerate(TOKENS)}, "bidirectional")
    req = run(engine, "hierarchical", {"block_size": 8})
    assert req.output_ids() == TOKENS and req.stats.accepted == bisect_reference(8) * 2


def test_credit_decides_steady_tokens_faster_than_threshold():
    script = {i: row({t: 0.8}) for i, t in enumerate(TOKENS)}
    engine, _ = drafter_engine(script, "bidirectional")
    credit = run(engine, "credit", {"block_size": 8, "smoothing": False, "alpha": 1.0})
    threshold = run(engine, "threshold", {"block_size": 8, "cache": "none"})
    assert credit.output_ids() == threshold.output_ids() == TOKENS
    assert threshold.stats.accepted == [1] * 16  # 0.8 never clears 0.9: one token per round
    assert credit.stats.rounds < threshold.stats.rounds


def entropy(logprobs: torch.Tensor) -> float:
    p = logprobs.exp()
    return float(-(p * logprobs.nan_to_num(neginf=0.0)).sum())


def wedlm(script: dict, n: int, window: int, tau: float, lam: float) -> list[list[tuple[int, int]]]:
    """002 Alg. 1 (Streaming Parallel Decoding) on a script of position -> log-probabilities whatever the context:
    per forward, its window as (token, position), filled slots before masks; the prompt's prefill left out.
    Commit the leftmost contiguous filled prefix, fill the masks with H_i + lam * d_i < tau (else the lowest), then
    refill the window with as many masks as were committed."""
    slots, filled, forwards = list(range(min(window, n))), {}, []
    appended = len(slots)  # positions handed to the window so far
    while slots:
        forwards.append([(filled[p], p) for p in slots if p in filled] + [(MASK, p) for p in slots if p not in filled])
        committed = next((i for i, p in enumerate(slots) if p not in filled), len(slots))
        slots = slots[committed:]
        masks = [p for p in slots if p not in filled]
        if masks:
            adjusted = {p: entropy(script[p]) + lam * (p - masks[0]) for p in masks}
            chosen = [p for p in masks if adjusted[p] < tau] or [min(masks, key=adjusted.get)]
            filled |= {p: int(script[p].argmax()) for p in chosen}
        slots += list(range(appended, min(appended + committed, n)))
        appended = min(appended + committed, n)
    return forwards


def hesitant() -> dict:
    """Unsure at positions 2 and 9 (entropy about 3): the window fills around them, out of order."""
    script = confident(TOKENS)
    for p in (2, 9):
        script[p] = row({TOKENS[p]: 0.3})
    return script


@pytest.mark.parametrize("name", ["confident", "hesitant"])
def test_streaming_places_refills_and_feeds_its_window_as_wedlm_algorithm_1(name):
    """W = 6, tau 0.4, lambda 0.1. On the confident drafter Alg. 1 fills 4, then 2 (the 4 filled tokens still hold
    their slots while they are committed), 4, 2, ..., each forward over 6 tokens. The hesitant one fills around its
    unsure positions, and at position 2 fills every slot of its window."""
    script = confident(TOKENS) if name == "confident" else hesitant()
    engine, model = drafter_engine(script, "causal")
    window, tau, lam = 6, 0.4, 0.1
    req = run(engine, "streaming", {"window": window, "entropy_threshold": tau, "distance_penalty": lam})
    # a forward of Alg. 1 whose window is all filled only commits: the engine runs it with the next forward (the
    # masks see the same prefix), and ends once every token is decided
    reference, commits = [], []
    for forward in wedlm(script, 16, window, tau, lam):
        if any(t == MASK for t, _ in forward):
            reference.append(commits + forward)
        commits = [] if any(t == MASK for t, _ in forward) else forward
    seen = [
        [(t, p - len(PROMPT)) for t, p in zip(ids[0].tolist(), positions, strict=True) if p >= len(PROMPT)]
        for (ids, _), (positions, _) in zip(model.calls, model.positions, strict=True)
    ]
    assert seen == reference and req.output_ids() == TOKENS
    # 002 Eq. 4: N_fwd counts every token instance through the drafter after the prompt's prefill
    n_fwd = sum(model.inputs) - len(PROMPT)
    assert n_fwd == sum(map(len, reference)) and req.stats.drafter_tokens_processed == n_fwd
    assert req.stats.p_cache == pytest.approx(16 / n_fwd)
    if name == "confident":
        assert req.stats.accepted == [4, 2, 4, 2, 4] and n_fwd == 5 * window


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_p_cache_counts_recomputation_of_bidirectional_forwards(cache):
    engine, model = drafter_engine(confident(TOKENS), "bidirectional")
    req = run(engine, "threshold", {"block_size": 8, "cache": cache})
    assert req.stats.drafter_tokens_processed == sum(model.inputs) - len(PROMPT)
    assert req.stats.p_cache == pytest.approx(16 / (sum(model.inputs) - len(PROMPT)))


class IdentityFilter:
    """A Learn2PD filter whose score is the confidence itself."""

    config = FilterConfig(block_size=32)

    def accept_probs_batch(self, confidences: list[torch.Tensor]) -> list[torch.Tensor]:
        return [confidence.clone() for confidence in confidences]


def test_filter_scores_see_the_block_with_decided_positions_certain():
    prop = Proposal(torch.tensor([9, 12]), torch.tensor([3, 4]), torch.tensor([0.3, 0.7]), torch.zeros(2), None)
    call = filter_call("causal", Region(8, 16), prop)
    assert (call.role, call.method) == ("filter", "accept_probs")
    confidence = call.args.confidence
    assert confidence.tolist() == pytest.approx([1, 0.3, 1, 1, 0.7, 1, 1, 1])
    assert proposal_scores(confidence * 0.5, Region(8, 16), prop).tolist() == pytest.approx([0.15, 0.35])


def test_learn2pd_accepts_what_the_filter_scores_above_its_threshold():
    script = confident(TOKENS)
    script[2] = row({TOKENS[2]: 0.9, 3: 0.05})
    engine, _ = drafter_engine(script, "bidirectional", filter_model=IdentityFilter())
    req = run(engine, "learn2pd", {"block_size": 8, "filter_threshold": 0.96})
    assert req.output_ids() == TOKENS and req.stats.accepted == [7, 1, 8]
    assert req.stats.filter_calls == 3


@pytest.mark.parametrize("k", [0, 2, 5])
def test_guided_accepts_exactly_the_agreeing_drafts(k):
    drafts = GUIDER[:k] + [2] * (16 - k)  # the drafter agrees with the guider on the first k positions only
    guider = ScriptedLM(confident(GUIDER), len(PROMPT))
    engine, _ = drafter_engine(confident(drafts), "bidirectional", guider=guider)
    req = run(engine, "guided", {"block_size": 8, "top_k_match": 1, "follow": "guider"})
    assert req.output_ids() == GUIDER  # lossless against the guider
    assert req.stats.accepted[0] == max(k, 1)  # with no agreement, the guider's own token


@pytest.mark.parametrize("k", [0, 2, 5])
def test_pipeline_accepts_the_agreeing_drafts_and_the_bonus_token(k):
    drafts = GUIDER[:k] + [2] * (16 - k)
    guider = ScriptedLM(confident(GUIDER), len(PROMPT))
    engine, _ = drafter_engine(confident(drafts), "causal", guider=guider, filter_model=IdentityFilter())
    req = run(engine, "pipeline", {"window": 8, "top_k_match": 1, "bonus_token": True, "follow": "guider"})
    assert req.output_ids() == GUIDER
    assert req.stats.accepted[0] == k + 1


class RecordingFilter(IdentityFilter):
    def __init__(self):
        self.calls = 0

    def accept_probs_batch(self, confidences: list[torch.Tensor]) -> list[torch.Tensor]:
        self.calls += 1
        return IdentityFilter.accept_probs_batch(self, confidences)


@pytest.mark.parametrize(
    "strategy,params,family",
    [
        ("learn2pd", {"block_size": 8}, "bidirectional"),
        ("learn2pd", {"block_size": 8, "drafter": "causal"}, "causal"),
        ("pipeline", {"window": 8}, "causal"),
    ],
)
def test_each_strategy_asks_the_filter_of_its_drafters_family(strategy, params, family):
    filters = {"causal": RecordingFilter(), "bidirectional": RecordingFilter()}
    models = {
        "drafter": ScriptedLM(confident(GUIDER), len(PROMPT)),
        "drafter_bidirectional": ScriptedLM(confident(GUIDER), len(PROMPT), bidirectional=True),
        "guider": ScriptedLM(confident(GUIDER), len(PROMPT)),
    }
    req = run(scripted_engine(models, 16, filters), strategy, params)
    assert req.output_ids() == GUIDER
    other = "causal" if family == "bidirectional" else "bidirectional"
    assert filters[family].calls == req.stats.filter_calls > 0 and filters[other].calls == 0


def test_a_strategy_without_its_familys_filter_is_refused():
    models = {"drafter": ScriptedLM(confident(GUIDER), len(PROMPT)), "guider": ScriptedLM(confident(GUIDER), 3)}
    engine = scripted_engine(models, 16, {"bidirectional": RecordingFilter()})
    with pytest.raises(ValueError, match="filter"):
        run(engine, "pipeline", {"window": 8})
