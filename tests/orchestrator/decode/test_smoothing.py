"""Iteration smoothing (001 A.1) seen from the engine: a strategy with smoothing on hands the bidirectional drafter,
at every forward of a block but its first, the block's masked inputs mixed with the previous forward's expected
embedding: e(MASK) + alpha_k * sum_v p(v) e(v), alpha_k = min(0.1 + 0.05 k, 0.3) at the block's k-th forward, k
counted from 0 and restarting in each block (README, deviations). Checked against that rule written out here, on
a scripted drafter whose embeddings are one-hot, so each input row is its token plus the mixed-in distribution."""

import pytest
import torch

from tests.scripted import MASK, VOCAB, ScriptedLM, row, scripted_engine

PROMPT = [5, 6, 7]
N, BLOCK = 16, 8
SCRIPT = {p: row({10 + p: 0.8, 3: 0.15}) for p in range(N)}  # 0.8 stays under the thresholds: many forwards a block


class EmbeddingsLM(ScriptedLM):
    """Records each forward's input embeddings [Q, V]."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.embeddings: list[torch.Tensor] = []

    def decode(self, hidden, positions, segments, rows=None):
        self.embeddings.append(hidden.clone())
        return super().decode(hidden, positions, segments, rows)


def smoothed_inputs(canvas: torch.Tensor, k: int, lo: int) -> torch.Tensor:
    """The rule: [N, V] inputs of a forward over the whole canvas (token ids, MASK where masked), the block at lo."""
    inputs = torch.nn.functional.one_hot(canvas, VOCAB).float()
    if k == 0:
        return inputs
    alpha = min(0.1 + 0.05 * k, 0.3)
    for p in range(lo, lo + BLOCK):
        if canvas[p] == MASK:
            inputs[p] += alpha * SCRIPT[p].exp()
    return inputs


CASES = [
    ("credit", {"block_size": BLOCK, "cache": "none"}),  # smoothing on by default (001 Table 3)
    ("threshold", {"block_size": BLOCK, "cache": "none", "smoothing": True}),
    ("hierarchical", {"block_size": BLOCK, "cache": "none", "smoothing": True, "low_threshold": 0.9}),
]


@pytest.mark.parametrize("strategy,params", CASES, ids=[c[0] for c in CASES])
def test_the_strategys_smoothing_reaches_the_drafter_with_the_weight_of_each_blocks_step(strategy, params):
    model = EmbeddingsLM(SCRIPT, len(PROMPT), bidirectional=True)
    engine = scripted_engine({"drafter_bidirectional": model}, N)
    assert engine.generate(PROMPT, strategy, params, N).token_ids == [10 + p for p in range(N)]
    steps, block = [], None
    for embeds in model.embeddings:  # cache none: each forward covers prompt + the whole canvas
        rows = embeds[len(PROMPT) :]
        canvas = torch.where(rows[:, MASK] >= 1, MASK, rows.argmax(-1))  # a mixed-in mask row keeps its 1 at MASK
        lo = int((canvas == MASK).nonzero()[0]) // BLOCK * BLOCK
        steps.append(steps[-1] + 1 if lo == block else 0)
        block = lo
        torch.testing.assert_close(rows, smoothed_inputs(canvas, steps[-1], lo), atol=1e-6, rtol=0)
    assert steps.count(0) == 2 and max(steps) >= 4  # both blocks, each far enough to reach the cap
