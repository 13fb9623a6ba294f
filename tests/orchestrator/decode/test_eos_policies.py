"""What a decided EOS does, per strategy (decode/commit.py, EOS policies), on a scripted bidirectional
drafter run without a cache, so that every forward's input is the canvas the drafter sees.

The script decides the EOS at position 3 first (probability 0.99); the positions around it in the first block are
uncertain (0.6), so each is decided in a round of its own afterwards; the second block is confident. Whatever the
policy, the output and the stream end at the EOS.
"""

import pytest
import torch

from tests.orchestrator.decode.test_scripted_strategies import PROMPT, IdentityFilter, drafter_engine
from tests.scripted import EOS, MASK, ScriptedLM, row

N, BLOCK, AT = 16, 8, 3
BEFORE, AFTER, NEXT = [10, 11, 12], [20, 21, 22, 23], list(range(24, 32))
SCRIPT = {p: row({t: 0.6}) for p, t in enumerate(BEFORE)}
SCRIPT |= {AT: row({EOS: 0.99})}
SCRIPT |= {p: row({t: 0.6}) for p, t in enumerate(AFTER, AT + 1)}
SCRIPT |= {p: row({t: 0.99}) for p, t in enumerate(NEXT, BLOCK)}
PARAMS = {"block_size": BLOCK, "cache": "none"}


def decode(strategy: str, params: dict, family: str = "bidirectional"):
    others = {"filter_model": IdentityFilter()} if strategy == "learn2pd" else {}
    engine, model = drafter_engine(SCRIPT, family, N, **others)
    req = engine.request(PROMPT)
    events = list(engine.stream(req, strategy, {**PARAMS, **params}))
    assert req.output_ids() == BEFORE and req.finish_reason == "eos"
    assert [t for e in events for t in e.ids] == [*BEFORE, EOS]  # the stream ends at the EOS
    assert all(offset + len(ids) <= AT + 1 for e in events for offset, ids in e.spans)
    return req, seen_canvases(model)


def seen_canvases(model: ScriptedLM) -> list[torch.Tensor]:
    """Per forward, the canvas [N] the drafter was given (cache none: prompt + the whole visible canvas)."""
    return [ids[0, len(PROMPT) :] for ids, _ in model.calls]


@pytest.mark.parametrize("strategy,params", [("mdm", {"steps_per_block": BLOCK}), ("threshold", {})])
def test_mdm_and_threshold_decode_the_full_canvas(strategy, params):
    """LLaDA / Fast-dLLM: positions past the EOS stay in context and are decoded, to the canvas end."""
    req, canvases = decode(strategy, params)
    assert all(len(c) == N for c in canvases)
    assert req.decided.all() and req.tokens[AT + 1 :].tolist() == AFTER + NEXT
    assert (canvases[-1][BLOCK:] == MASK).any()  # the last forward decoded the second block


@pytest.mark.parametrize("strategy", ["credit", "hierarchical"])
def test_dinfer_strategies_fill_past_the_eos_and_keep_it_in_context(strategy):
    """dInfer (001 §3): once the EOS is decided, every later position is EOS, in the context of every later forward,
    and decoding ends when the positions before the EOS are decided."""
    req, canvases = decode(strategy, {"smoothing": False})
    assert req.tokens[AT:].tolist() == [EOS] * (N - AT) and req.decided.all()
    decided_eos = next(i for i, c in enumerate(canvases) if c[AT] == EOS)
    assert decided_eos == 1 and len(canvases) == 1 + len(BEFORE)  # one forward per uncertain position before it
    for canvas in canvases[decided_eos:]:
        assert len(canvas) == N and canvas[AT:].tolist() == [EOS] * (N - AT)


def test_learn2pd_finishes_the_block_then_stops():
    """EoTP (004 Alg. 3): the block holding the EOS is decoded to its end in full context; no later block is."""
    req, canvases = decode("learn2pd", {"filter_threshold": 0.96})
    assert all(len(c) == N for c in canvases)
    assert req.tokens[AT + 1 : BLOCK].tolist() == AFTER  # decoded, not cut or filled
    assert not req.decided[BLOCK:].any() and all((c[BLOCK:] == MASK).all() for c in canvases)
    assert len(canvases) == 1 + len(BEFORE) + len(AFTER)


def test_a_causal_drafter_keeps_eos_truncation():
    """000 B.1: with the causal drafter the canvas ends just past the first decided EOS."""
    req, _ = decode("threshold", {"drafter": "causal"}, family="causal")
    assert req.horizon == AT + 1 and not req.decided[AT + 1 :].any()
