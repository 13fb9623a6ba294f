"""What a load level sends."""

from collections import Counter

from services.cli.load import work


def test_a_level_sends_8_requests_per_stream_and_each_prompt_8_times():
    assert len(work(["a", "b", "c"], 16)) == 16 * 8  # steady state, not the ramp-down of the last requests
    assert Counter(work(["a", "b", "c"], 1)) == {"a": 8, "b": 8, "c": 8}
