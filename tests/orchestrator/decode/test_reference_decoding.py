"""`mdm` and `threshold` on the shipped bidirectional drafter decode token for token as the published loops do
(reference_decoding.py: vanilla LLaDA low-confidence remasking and Fast-dLLM threshold decoding,
with Fast-dLLM's prefix and dual caches), in 8-token blocks, forward for forward over the whole canvas.

EOS: both keep every position in context to the canvas's end and cut the output at the first EOS afterwards. On the
PAST_EOS count prompts the EOS is decided while positions before it are still masked (asserted on the reference's
trajectory, so a prompt that stops qualifying fails loudly): an engine that cut the canvas just past that EOS decodes
them differently. The other held-out prompts run past the canvas (no EOS at all) or decide their EOS after everything
before it.
"""

import pytest

from services.common.config import EngineConfig
from services.common.models import load_model
from services.orchestrator.engine.engine import Engine
from services.training import tasks
from tests.orchestrator.decode import reference_decoding as ref

pytestmark = pytest.mark.slow  # loads the shipped drafter

DRAFTER = "models/drafter-bidirectional"
BLOCK, STEPS, THRESHOLD = 8, 3, 0.9  # 3 steps for 8 tokens: LLaDA's uneven schedule [3, 3, 2]
# EOS decided early; outputs of 23-31 and 55-59 tokens. With EOS truncation instead, the engine's tokens or forwards
# differ from the loop's in every strategy and cache mode on the first, and with threshold on the second.
PAST_EOS = [("count from 0 step 2 for 10:", 64), ("count from 9 step 1 for 31:", 64)]
PROMPTS = PAST_EOS + [  # (held-out prompt, max_new_tokens)
    ("count from 30 step 1 for 39:", 16),  # no EOS in the canvas; the cache modes decode differently
    ("count from 33 step 1 for 17:", 24),  # EOS in the canvas; prefix and dual decode differently
    ("sort: 58 53 23 62 99 63 60 29", 24),  # EOS in the third block
    ("reverse: r t q e d y z u z k o m e v l m s l x d h j a x", 24),  # no EOS
]
STRATEGIES = {
    "mdm": ({"block_size": BLOCK, "steps_per_block": STEPS}, ref.low_confidence(BLOCK, STEPS)),
    "threshold": ({"block_size": BLOCK, "threshold": THRESHOLD}, ref.threshold(THRESHOLD)),
}


@pytest.fixture(scope="module")
def shipped() -> Engine:
    return Engine(EngineConfig(models={"drafter_bidirectional": DRAFTER}))


@pytest.fixture(scope="module")
def model():
    loaded = load_model(DRAFTER)
    assert loaded.meta.logits_shift == 0  # the reference reads position i's prediction at output i
    return loaded.model


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("prompt,length", PROMPTS)
def test_engine_decodes_as_the_published_loop(shipped, model, strategy, cache, prompt, length):
    assert tasks.split_of(prompt) == "heldout"
    params, select = STRATEGIES[strategy]
    meta = shipped.models.meta()
    prompt_ids = shipped.request(prompt, length).prompt_ids
    canvas, trajectory = ref.decode(model, prompt_ids, length, BLOCK, select, meta.mask_id, cache)
    if (prompt, length) in PAST_EOS:
        assert ref.eos_ahead(trajectory, meta.eos_id, meta.mask_id), "the EOS is no longer decided ahead of masks"
    result = shipped.generate(prompt, strategy, {**params, "cache": cache}, length)
    assert result.token_ids == ref.output(canvas, meta.eos_id)
    assert result.stats["drafter_forwards"] == len(trajectory)  # one engine forward per step of the loop
