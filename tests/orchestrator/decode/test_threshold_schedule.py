"""IterSmooth's decaying decode threshold (dInfer 001 A.1): with iteration smoothing, a threshold gate's threshold
starts at 1.0 and falls toward the strategy's, max(1 - decay * t, threshold) at the request's t-th diffusion iteration
(dInfer's iter_no, over the whole request). Checked on a scripted drafter whose confidences the test sets."""

import pytest

from tests.scripted import ScriptedLM, row, scripted_engine

PROMPT = [5, 6, 7]
TOKENS = list(range(8, 24))  # two blocks of 8
CONFIDENCE = [0.99, 0.985, 0.975, 0.965, 0.955, 0.945, 0.935, 0.915] * 2  # between the schedule's steps


def engine_for(confidences: list[float]):
    script = {i: row({t: p, 2: (1 - p) / 2}) for i, (t, p) in enumerate(zip(TOKENS, confidences, strict=True))}
    model = ScriptedLM(script, len(PROMPT), bidirectional=True)
    return scripted_engine({"drafter_bidirectional": model}, len(TOKENS))


def schedule_reference(confidences: list[float], block: int, threshold: float, decay: float | None) -> list[int]:
    """Tokens decided per round by threshold decoding (every masked token of the block above the threshold, else the
    most confident one) with the threshold at round t max(1 - decay * t, threshold), t counted over the request."""
    accepted, t = [], 0
    for start in range(0, len(confidences), block):
        masked = confidences[start : start + block]
        while masked:
            now = threshold if decay is None else max(1 - decay * t, threshold)
            passing = [c for c in masked if c > now] or [max(masked)]
            masked = [c for c in masked if c not in passing]
            accepted.append(len(passing))
            t += 1
    return accepted


@pytest.mark.parametrize("decay", [0.02, 0.05])
@pytest.mark.parametrize("cache", ["none", "vicinity"])
def test_threshold_falls_from_one_with_iteration_smoothing(decay, cache):
    engine = engine_for(CONFIDENCE)
    req = engine.request(PROMPT)
    params = {"block_size": 8, "cache": cache, "smoothing": True, "threshold_decay": decay, "threshold": 0.9}
    list(engine.stream(req, "threshold", params))
    assert req.output_ids() == TOKENS
    assert req.stats.accepted == schedule_reference(CONFIDENCE, 8, 0.9, decay)


def test_default_decay_is_dinfers_and_reaches_the_target_in_the_first_block():
    engine = engine_for(CONFIDENCE)
    req = engine.request(PROMPT)
    list(engine.stream(req, "threshold", {"block_size": 8, "smoothing": True}))
    # 1.0, 0.98, 0.96, 0.94, 0.92, 0.90: the first block over six rounds, the second (t >= 6) in one
    assert req.stats.accepted == [1, 1, 2, 2, 1, 1, 8]


def test_without_smoothing_the_threshold_is_fixed():
    engine = engine_for(CONFIDENCE)
    req = engine.request(PROMPT)
    list(engine.stream(req, "threshold", {"block_size": 8, "smoothing": False, "threshold_decay": 0.05}))
    assert req.stats.accepted == schedule_reference(CONFIDENCE, 8, 0.9, None) == [8, 8]


def test_credit_decoding_with_smoothing_follows_the_schedule():
    """credit smooths by default (001 Table 3): its first round meets threshold 1.0 and decides one token."""
    engine = engine_for(CONFIDENCE)
    smoothed, plain = engine.request(PROMPT), engine.request(PROMPT)
    list(engine.stream(smoothed, "credit", {"block_size": 8}))
    list(engine.stream(plain, "credit", {"block_size": 8, "smoothing": False}))
    assert smoothed.stats.accepted[0] == 1 < plain.stats.accepted[0]
