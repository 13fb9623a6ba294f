"""scripts/hop_bytes.py, which the README cites for what a served round sends: on the shipped zoo, a `credit` call's
request crosses without its gate's [block, V] scores (services/serving/pickling.py: ENGINE_ONLY), and as what changed
in fewer bytes than whole (services/serving/request_sync.py)."""

import re

import pytest

from tests.readme import run_script
from tests.zoo import needs_zoo


@pytest.mark.slow
@needs_zoo
def test_credit_sends_kilobytes_a_request_and_round_not_its_scores():
    out = run_script("scripts/hop_bytes.py", "credit", "2")
    found = re.search(
        r"(\d+) request-rounds; per request-round out (\d+) B, back (\d+) B; each request whole, out (\d+)", out
    )
    rounds, sent, back, whole = map(int, found.groups())
    assert rounds > 0
    assert sent < whole < 8_000  # the scores alone are [block, V] floats: hundreds of KB
    assert back > 100_000  # the gate fuses the drafter's whole distribution, which comes back (keep_logits)


@pytest.mark.slow
@needs_zoo
@pytest.mark.parametrize(("strategy", "most"), [("ar", 2_000), ("slot", 6_000)])
def test_hosts_sample_where_the_logits_are_and_send_back_tokens(strategy, most):
    """AR decoding's next token and slot completion are drawn on the drafter's or AR model's host, and slot
    verification reads its drafts there: a reply carries tokens and their probabilities, not [n, V] logits (before,
    16.5 KB a request and round for `ar`, 865 KB for `slot`)."""
    out = run_script("scripts/hop_bytes.py", strategy, "2", "seeded")
    back = int(re.search(r"per request-round out \d+ B, back (\d+) B", out).group(1))
    assert back < most
