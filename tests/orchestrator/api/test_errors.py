"""Bad arguments raise one clear error naming the parameter."""

import pytest

from services.common.sampling import SamplingParams


@pytest.mark.parametrize(
    "strategy,params,field",
    [
        ("nope", {}, "strategy"),
        ("threshold", {"threshold": "1.5"}, "threshold"),
        ("credit", {"beta": "-0.1"}, "beta"),
        ("guided", {"guidance_threshold": "2"}, "guidance_threshold"),
        ("streaming", {"window": "0"}, "window"),
        ("pipeline", {"window": "0"}, "window"),
        ("slot", {"slot_size": "3", "block_size": "8"}, "slot_size"),
        ("slot", {"token_threshold": "1.01"}, "token_threshold"),
        ("mdm", {"drafter": "sideways"}, "drafter"),
        ("threshold", {"cache": "huge"}, "cache"),
        ("threshold", {"no_such_knob": "1"}, "no_such_knob"),
        ("threshold", {"block_size": "many"}, "block_size"),
    ],
)
def test_bad_strategy_arguments(engine, strategy, params, field):
    req = engine.request("count from 1 to 9:", max_new_tokens=4)
    with pytest.raises(ValueError, match=field):
        engine.stream(req, strategy, params)


def test_bad_request_arguments(engine):
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.request("count", max_new_tokens=0)
    with pytest.raises(ValueError, match="prompt"):
        engine.request("word " * 600, max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt"):
        engine.request([], max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt token ids"):
        engine.request([10**6], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.request("count", max_new_tokens=10_000)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
