"""scripts/detok_cost.py, which the README cites for what detokenizing a round costs: TextStream's incremental
decode against decoding the whole output every round, on the shipped tokenizer."""

import re

from tests.readme import run_script
from tests.zoo import needs_zoo


@needs_zoo
def test_it_times_both_ways_of_detokenizing_a_round():
    out = run_script("scripts/detok_cost.py")
    assert re.search(r"^1024 output tokens, 4 per round \(256 rounds\)", out, re.M)
    for way in ("full decode per round", r"TextStream \(DecodeStream\)"):
        assert re.search(rf"^{way} +[\d.]+ us/round mean +[\d.]+ us/round at ~1024 tokens$", out, re.M)
