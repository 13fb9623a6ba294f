"""Whole decodes on scripted models: parallel acceptance shows exactly where the script makes tokens confident."""

import pytest
import torch

from services.common.proposal import Proposal, Region
from services.common.request import Request
from services.filter.model import FilterConfig
from services.orchestrator.decode.verify import filter_call, proposal_scores
from tests.orchestrator.decode.test_gates import bisect_reference
from tests.scripted import ScriptedLM, confident, row, scripted_engine

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


def test_streaming_accepts_what_the_distance_penalty_allows_and_counts_p_cache():
    script = confident(TOKENS)
    engine, model = drafter_engine(script, "causal")
    window, tau, lam = 6, 0.4, 0.1
    req = run(engine, "streaming", {"window": window, "entropy_threshold": tau, "distance_penalty": lam})
    per_round = sum(entropy(script[0]) + lam * d < tau for d in range(window))
    assert per_round == 4
    assert req.output_ids() == TOKENS and req.stats.accepted == [4, 4, 4, 4]
    # 002 Eq. 4: N_fwd counts every token instance through the drafter after the prompt's prefill
    n_fwd = sum(model.inputs) - len(PROMPT)
    assert n_fwd == 6 + (4 + 6) + (4 + 6) + (4 + 4)  # window masks, plus the last commits recomputed in order
    assert req.stats.drafter_tokens_processed == n_fwd
    assert req.stats.p_cache == pytest.approx(16 / n_fwd)


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
    req = run(engine, "guided", {"block_size": 8, "top_k_match": 1})
    assert req.output_ids() == GUIDER  # lossless against the guider
    assert req.stats.accepted[0] == max(k, 1)  # with no agreement, the guider's own token


@pytest.mark.parametrize("k", [0, 2, 5])
def test_pipeline_accepts_the_agreeing_drafts_and_the_bonus_token(k):
    drafts = GUIDER[:k] + [2] * (16 - k)
    guider = ScriptedLM(confident(GUIDER), len(PROMPT))
    engine, _ = drafter_engine(confident(drafts), "causal", guider=guider, filter_model=IdentityFilter())
    req = run(engine, "pipeline", {"window": 8, "top_k_match": 1, "bonus_token": True})
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
