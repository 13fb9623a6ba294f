"""The shipped model zoo: every model loads through the engine's model layer and decodes; cards and sizes hold."""

import os

import pytest
import torch

from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.orchestrator.decode.strategies import STRATEGIES
from services.orchestrator.engine.engine import Engine
from tests.zoo import needs_zoo

CONFIG = EngineConfig.from_yaml(DEFAULT_CONFIG, max_new_tokens=24)
pytestmark = [pytest.mark.slow, needs_zoo]


@pytest.fixture(scope="module")
def zoo_engine() -> Engine:
    return Engine(CONFIG)


@pytest.mark.parametrize("role", sorted(CONFIG.models))
def test_each_model_is_small_and_has_a_card(role):
    path = CONFIG.models[role]
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    assert size <= 25 * 2**20, f"{role}: {size / 2**20:.1f} MiB"
    assert os.path.isfile(os.path.join(path, "README.md"))


def test_special_tokens_are_shared(zoo_engine):
    metas = {role: zoo_engine.executor.load(role).meta for role in CONFIG.models if "filter" not in role}
    assert len({(m.mask_id, m.eos_id) for m in metas.values()}) == 1
    assert zoo_engine.tokenizer.convert_ids_to_tokens(metas["drafter"].mask_id) == "<|mask|>"


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_decodes_on_the_zoo(zoo_engine, strategy):
    result = zoo_engine.generate("count from 3 step 2 for 12:", strategy)
    assert result.token_ids and result.finish_reason in ("eos", "length")


def test_guided_top1_is_lossless_on_the_zoo(zoo_engine):
    for prompt in ("sort: 42 7 19 88 3:", "copy: red blue green red yellow blue:"):
        reference = zoo_engine.generate(prompt, "ar", {"model": "guider"})
        speculative = {"top_k_match": 1, "follow": "guider"}
        assert zoo_engine.generate(prompt, "guided", speculative).token_ids == reference.token_ids
        assert zoo_engine.generate(prompt, "pipeline", speculative).token_ids == reference.token_ids


def test_pipeline_decodes_in_bfloat16_batched():
    engine = Engine(EngineConfig.from_yaml(DEFAULT_CONFIG, max_new_tokens=24, dtype="bfloat16"))
    answers = {"sort: 42 7 19 88 3 55": "3 7 19 42 55 88", "reverse: a b c d e": "e d c b a", "add 366+558=": "0924"}
    requests = [engine.add_request(prompt, "pipeline") for prompt in answers]
    while engine.has_unfinished():
        engine.step()
    assert engine.executor.load("drafter").model.dtype == engine.executor.load("guider").model.dtype == torch.bfloat16
    assert [engine.decode_text(r.output_ids()) for r in requests] == list(answers.values())
    assert all(r.stats.guider_forwards for r in requests)
