"""scripts/speculation_guesses.py, which overlap.py and the README cite for how often a guess of the gate's decision
would hold: its guesses read the drafter's probabilities as its docstring says, and on the shipped zoo each round
records the count the gate really accepted."""

import re
import sys

import pytest
import torch

from tests.readme import ROOT, run_script
from tests.zoo import needs_zoo

sys.path.insert(0, str(ROOT / "scripts"))
import speculation_guesses  # noqa: E402


def test_each_guess_reads_the_drafters_probabilities():
    probs = torch.tensor([0.95, 0.8, 0.6, 0.99, 0.2])
    got = speculation_guesses.guesses(probs)
    assert got["whole window"] == 5
    assert (got["conf > 0.5"], got["conf > 0.7"], got["conf > 0.9"]) == (4, 2, 1)
    # products so far: 0.95, 0.76, 0.456, 0.451, 0.090
    assert (got["cumprod > 0.3"], got["cumprod > 0.5"], got["cumprod > 0.7"]) == (4, 2, 2)
    assert speculation_guesses.guesses(torch.tensor([0.1, 0.9]))["conf > 0.5"] == 1  # a round decides at least one


def test_the_prompts_are_the_bench_tasks_and_repeat_with_the_seed():
    texts = speculation_guesses.prompts(10)
    assert texts == speculation_guesses.prompts(10)
    heads = [re.match(r"\w+", t)[0] for t in texts]
    assert heads == ["count", "copy", "reverse", "sort", "add"] * 2


@pytest.mark.slow
@needs_zoo
def test_on_the_zoo_each_round_records_the_count_its_gate_accepted():
    from services.common.config import DEFAULT_CONFIG, EngineConfig
    from services.common.sampling import SamplingParams
    from services.orchestrator.decode.gate import GuiderAgreement
    from services.orchestrator.engine.engine import Engine

    decide = GuiderAgreement.drafter_tokens
    engine = Engine(EngineConfig.from_yaml(DEFAULT_CONFIG))
    texts = speculation_guesses.prompts(3)
    rounds = speculation_guesses.record_rounds(engine, texts)
    assert GuiderAgreement.drafter_tokens is decide  # put back
    reqs = [engine.request(text, 48, SamplingParams()) for text in texts]  # the same decodes again, unrecorded
    for req in reqs:
        engine.add(req, "pipeline", {"follow": "drafter"})
        while engine.has_unfinished():
            engine.step()
    assert [n for _, n in rounds] == [n for req in reqs for n in req.stats.accepted]  # tokens decided per round
    proposed = [n for req in reqs for n in req.stats.proposed]  # masks drafted per round
    assert [guess["whole window"] for guess, _ in rounds] == proposed


@pytest.mark.slow
@needs_zoo
@pytest.mark.parametrize("prompts", ["5", "bench"])
def test_it_prints_each_guess_and_the_best_sets(prompts):
    out = run_script("scripts/speculation_guesses.py", prompts)
    assert "of 5 prompts" in out
    shares = dict(re.findall(r"^  (\S.*?)\s+([\d.]+)$", out, re.M))
    assert {"whole window", "conf > 0.7", "cumprod > 0.5"} <= set(shares)
    assert all(0.0 <= float(v) <= 1.0 for v in shares.values())
    assert float(shares[next(k for k in shares if k.startswith("best 3"))]) >= max(
        float(v) for k, v in shares.items() if not k.startswith(("best", "guesses="))
    )
    # overlap's guesses: the whole window first, more counts hold more often, and every count always holds
    overlap = [float(shares[f"guesses={k}"]) for k in speculation_guesses.GUESSES]
    assert overlap[0] == float(shares["whole window"]) and overlap == sorted(overlap) and overlap[-1] == 1.0
