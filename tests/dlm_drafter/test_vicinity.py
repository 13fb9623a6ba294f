"""Vicinity KV refresh (dInfer 001 §2.3, App. D) against a plain reference of which positions each forward
recomputes and which it reads from the cache, on a scripted bidirectional drafter whose cache entries hold their
position ids (tests/scripted.py)."""

import pytest

from tests.scripted import ScriptedLM, confident, row, scripted_engine

PROMPT = [5, 6, 7]
TOKENS = list(range(8, 32))  # 24 tokens: three blocks of 8
UNCERTAIN = {1: 0.6, 4: 0.55, 6: 0.5, 12: 0.6, 17: 0.6, 21: 0.55}  # position -> confidence below the threshold
# threshold 0.9: a block's first round decides its confident tokens, then one uncertain token a round
BLOCK_OF_ROUND = [0] * 4 + [8] * 2 + [16] * 3


def vicinity_reference(
    P: int, n: int, blocks: list[int], size: int, behind: int, ahead: int, warmup: int
) -> list[tuple[set[int], set[int]]]:
    """Per forward, (positions recomputed, positions whose KV is read from the cache), from dInfer's description:
    the first `warmup` forwards of a request run over the whole sequence with no cache; after that, the first forward
    and the first of every new block recompute everything and refresh the whole cache; the other forwards of a block
    recompute its vicinity, the block with `behind` positions before and `ahead` after, over the cached rest."""
    everything = set(range(P + n))
    forwards, cached, refreshed = [], set(), None
    for i, start in enumerate(blocks):
        vicinity = set(range(max(0, P + start - behind), min(P + n, P + start + size + ahead)))
        if i < warmup:
            forwards.append((everything, set()))
        elif refreshed != start:
            forwards.append((everything, set()))
            cached, refreshed = everything - vicinity, start
        else:
            forwards.append((vicinity, cached))
    return forwards


@pytest.mark.parametrize(
    "looks",
    [
        {"prefix_look": 3, "after_look": 5, "warmup_times": 2},  # windows clipped by the prompt's start and the end
        {"prefix_look": 2, "after_look": 1, "warmup_times": 0},
        {},  # App. D: 16, 16, warm-up 4
    ],
)
def test_vicinity_recomputes_what_dinfer_describes(looks):
    script = confident(TOKENS)
    for position, p in UNCERTAIN.items():
        script[position] = row({TOKENS[position]: p, 2: (1 - p) / 2})
    model = ScriptedLM(script, len(PROMPT), bidirectional=True)
    engine = scripted_engine({"drafter_bidirectional": model}, len(TOKENS))
    req = engine.request(PROMPT)
    list(engine.stream(req, "threshold", {"block_size": 8, "cache": "vicinity", **looks}))
    assert req.output_ids() == TOKENS and req.stats.rounds == len(BLOCK_OF_ROUND)

    behind, ahead, warmup = ({"prefix_look": 16, "after_look": 16, "warmup_times": 4} | looks).values()
    expected = vicinity_reference(len(PROMPT), len(TOKENS), BLOCK_OF_ROUND, 8, behind, ahead, warmup)
    assert len(model.positions) == len(expected)
    for i, ((inputs, cached), (recomputed, read)) in enumerate(zip(model.positions, expected, strict=True)):
        assert len(set(inputs)) == len(inputs) and len(set(cached)) == len(cached), f"forward {i}: a position twice"
        assert (set(inputs), set(cached)) == (recomputed, read), f"forward {i}"


def test_vicinity_warm_up_keeps_no_cache_and_later_forwards_read_one():
    """The refresh is visible in cost: warm-up forwards are full, window forwards push fewer tokens through."""
    model = ScriptedLM(confident(TOKENS) | {1: row({TOKENS[1]: 0.6}), 4: row({TOKENS[4]: 0.55})}, len(PROMPT), True)
    engine = scripted_engine({"drafter_bidirectional": model}, len(TOKENS))
    req = engine.request(PROMPT)
    params = {"block_size": 8, "cache": "vicinity", "prefix_look": 2, "after_look": 2, "warmup_times": 1}
    list(engine.stream(req, "threshold", params))
    full = len(PROMPT) + len(TOKENS)
    assert model.inputs[:3] == [full, full, 2 + 8 + 2]  # warm-up, the refresh, then the block's vicinity
    assert [len(cached) for _, cached in model.positions[:3]] == [0, 0, full - 12]
