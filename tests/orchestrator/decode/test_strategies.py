"""Every strategy on tiny random models of each family; invariants every output must keep."""

from dataclasses import fields

import pytest

from services.common.contract import ROLES
from services.common.proposal import Region
from services.common.sampling import SamplingParams
from services.orchestrator.decode.strategies import STRATEGIES, make_params

PROMPTS = ["count from 1 to 9:", "copy: the lazy dog", "def add(a, b):"]
BLOCK = ["mdm", "threshold", "credit", "hierarchical", "learn2pd", "guided"]
CASES = (
    [("ar", {"model": m}) for m in ("ar", "guider", "drafter")]
    + [(s, {"drafter": d, "block_size": 8}) for s in BLOCK for d in ("causal", "bidirectional")]
    + [("slot", {"slot_size": 4, "block_size": 8}), ("streaming", {"window": 6}), ("pipeline", {"window": 6})]
)


@pytest.mark.parametrize("strategy,params", CASES, ids=[f"{s}-{'-'.join(map(str, p.values()))}" for s, p in CASES])
def test_strategy_runs_and_keeps_invariants(engine, strategy, params):
    mask_id = engine.executor.meta().mask_id
    eos_id = engine.executor.meta().eos_id
    req = engine.request(PROMPTS[0], max_new_tokens=20)
    events = list(engine.stream(req, strategy, params))
    ids = req.output_ids()
    assert mask_id not in ids and eos_id not in ids
    assert [t for e in events for t in e.ids][: len(ids)] == ids  # streamed text is the output
    assert events[-1].finish_reason == req.finish_reason
    if req.finish_reason == "length":
        assert len(ids) == 20
    else:
        assert req.finish_reason == "eos" and len(ids) < 20
    assert sorted(set(req.order)) == sorted(req.order)  # every position committed at most once
    stats = req.stats.to_dict()
    assert stats["tokens"] == len(ids) + (req.finish_reason == "eos") and stats["rounds"] == len(events)
    assert 0 < stats["p_cache"] <= 1 and stats["tpf"] > 0
    for role in ROLES.values():  # every cache the request held is released when it ends
        if role.holds_kv and role.host in engine.executor.hosts:
            assert req.id not in engine.executor.host(role.host).held(), role.host


INVALID = {int: -1, float: -1.0, str: "bogus"}
FIELDS = [(s, f.name, f.type) for s, cls in STRATEGIES.items() for f in fields(cls) if f.type in INVALID]


@pytest.mark.parametrize("strategy,name,kind", FIELDS, ids=[f"{s}-{n}" for s, n, _ in FIELDS])
def test_an_invalid_parameter_is_refused_naming_it(strategy, name, kind):
    with pytest.raises(ValueError, match=f"^{name} "):
        make_params(strategy, {name: INVALID[kind]})


def test_credit_decodes_in_blocks_of_64(engine):
    """001 §4.1: "a block size of 64 for all experiments"."""
    req = engine.request(PROMPTS[0], max_new_tokens=100)
    assert engine.add(req, "credit").stages.commit.region(req) == Region(0, 64)
    engine.cancel([req])


def test_every_named_strategy_is_covered():
    assert {s for s, _ in CASES} == set(STRATEGIES)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("drafter", ["causal", "bidirectional"])
def test_guided_top1_is_lossless_against_guider(engine, prompt, drafter):
    reference = engine.generate(prompt, "ar", {"model": "guider"}, max_new_tokens=24)
    params = {"top_k_match": 1, "drafter": drafter, "follow": "guider"}
    guided = engine.generate(prompt, "guided", params, max_new_tokens=24)
    assert guided.token_ids == reference.token_ids
    assert guided.finish_reason == reference.finish_reason


def test_pipeline_top1_is_lossless_against_guider(engine):
    for prompt in PROMPTS:
        reference = engine.generate(prompt, "ar", {"model": "guider"}, max_new_tokens=24)
        piped = engine.generate(prompt, "pipeline", {"top_k_match": 1, "window": 8, "follow": "guider"}, 24)
        assert piped.token_ids == reference.token_ids


def test_sampling_is_deterministic_per_seed(engine):
    def run(seed: int) -> list[int]:
        sampling = SamplingParams(temperature=1.0, top_p=0.9, seed=seed)
        return engine.generate(PROMPTS[1], "streaming", None, 16, sampling).token_ids

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_streaming_commits_in_order_and_window_keeps_its_size(engine):
    req = engine.request(PROMPTS[2], max_new_tokens=30)
    stages = engine.add(req, "streaming", {"window": 8}).stages
    sizes, seen = [], {}
    region = stages.commit.region

    def recording_region(r):
        reg = region(r)
        assert reg.start <= r.frontier < reg.end  # its slots from the first uncached position hold the frontier
        sizes.append((reg.end - reg.start, min(8, r.horizon - reg.start)))
        return reg

    stages.commit.region = recording_region
    streamed = []
    for event in engine.outputs(req):
        assert not event.spans  # streaming commits only the contiguous prefix
        streamed.extend(event.ids)
        for pos in req.decided.nonzero().squeeze(-1).tolist():  # a decided token never changes
            assert seen.setdefault(pos, int(req.tokens[pos])) == int(req.tokens[pos])
    assert req.order == list(range(len(req.order)))  # commits arrive in logical order
    assert all(size == expected for size, expected in sizes)
    assert streamed[: len(req.output_ids())] == req.output_ids()


def test_slot_output_restores_logical_order(engine):
    req = engine.request(PROMPTS[0], max_new_tokens=16)
    events = list(engine.stream(req, "slot", {"slot_size": 4, "block_size": 16, "slot_threshold": 0.0}))
    n = req.frontier
    assert sorted(req.order[:n]) == list(range(n)) or sorted(p for p in req.order if p < n) == list(range(n))
    assert req.decided[:n].all()
    canvas = {}
    for event in events:  # rebuild from the stream: contiguous text plus spans committed ahead
        for offset, ids in event.spans:
            for i, t in enumerate(ids):
                assert canvas.setdefault(offset + i, t) == t
    ids = req.output_ids()
    assert all(ids[p] == t for p, t in canvas.items() if p < len(ids))


class OracleDrafter:
    """A drafter that always agrees with the guider: it proposes the guider's greedy continuation."""

    def __init__(self, reference: list[int]):
        self.reference = reference

    def propose(self, req, region):
        """A propose stage that needs no model call."""
        import torch

        from services.common.proposal import propose_from_logits

        masked = (~req.decided[region.start : region.end]).nonzero().squeeze(-1) + region.start
        logits = torch.zeros(len(masked), 400)
        logits[torch.arange(len(masked)), torch.tensor([self.reference[p] for p in masked.tolist()])] = 5.0
        return propose_from_logits(masked, logits, req.sampling, req.rng, req.mask_id)
        yield


@pytest.mark.parametrize("prompt", PROMPTS)
def test_guided_needs_fewer_rounds_where_drafter_and_guider_agree(engine, prompt):
    reference = engine.generate(prompt, "ar", {"model": "guider"}, max_new_tokens=24)
    ids = reference.token_ids + [0] * 24
    req = engine.request(prompt, max_new_tokens=24)
    params = {"top_k_match": 1, "block_size": 8, "follow": "guider"}
    engine.add(req, "guided", params).stages.propose = OracleDrafter(ids).propose
    list(engine.outputs(req))
    assert req.output_ids() == reference.token_ids
    assert req.stats.rounds == -(-req.horizon // 8) < len(reference.token_ids)


class Served:
    """A Catalog serving the given model roles, with filters of block 32."""

    def __init__(self, roles):
        self.roles = frozenset(roles)

    def filter_block_size(self, drafter: str) -> int:
        return 32


CAUSAL, BIDIRECTIONAL = {"drafter": "causal"}, {"drafter": "bidirectional"}
NEEDS = [  # the models each decode runs, written out from the strategies table (README, Strategies)
    ("ar", {}, {"ar"}),
    ("ar", {"model": "guider"}, {"guider"}),
    ("ar", {"model": "drafter"}, {"drafter_ar"}),
    *[(s, BIDIRECTIONAL, {"drafter_bidirectional"}) for s in ("mdm", "threshold", "credit", "hierarchical")],
    *[(s, CAUSAL, {"drafter"}) for s in ("mdm", "threshold", "credit", "hierarchical")],
    ("slot", {}, {"drafter"}),
    ("streaming", {}, {"drafter"}),
    ("learn2pd", BIDIRECTIONAL, {"drafter_bidirectional", "filter_bidirectional"}),
    ("learn2pd", CAUSAL, {"drafter", "filter"}),
    ("guided", BIDIRECTIONAL, {"drafter_bidirectional", "guider"}),
    ("guided", CAUSAL, {"drafter", "guider"}),
    ("pipeline", {}, {"drafter", "guider", "filter"}),
]


@pytest.mark.parametrize("strategy,params,needs", NEEDS, ids=[f"{s}-{'-'.join(p.values())}" for s, p, _ in NEEDS])
def test_a_strategy_needs_exactly_the_models_it_runs(strategy, params, needs):
    make_params(strategy, params).build(Served(needs))
    for missing in needs:
        with pytest.raises(ValueError, match=f"model '{missing}' is not served here"):
            make_params(strategy, params).build(Served(needs - {missing}))


@pytest.mark.parametrize(
    "strategy,overrides,message",
    [
        ("nope", {}, r"unknown strategy 'nope'; choose from \['ar', 'credit', "),
        (
            "streaming",
            {"windw": "4"},
            r"unknown parameter 'windw' for strategy 'streaming'; known: \['distance_penalty', ",
        ),
        ("streaming", {"window": "four"}, r"parameter 'window': "),
    ],
)
def test_make_params_names_what_is_wrong(strategy, overrides, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        make_params(strategy, overrides)


def test_make_params_parses_set_strings_by_field_type():
    params = make_params(
        "pipeline", {"window": "8", "filter_threshold": "0.9", "bonus_token": "false", "follow": "guider"}
    )
    assert (params.window, params.filter_threshold, params.bonus_token, params.follow) == (8, 0.9, False, "guider")
