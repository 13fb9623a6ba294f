import random

import pytest
import torch

from services.common.dataset import Example
from services.dlm_drafter import corrupt
from services.dlm_drafter.train import make_hybrid_batch, make_mdm_batch

MASK, EOS = 1, 0
P = [10, 11, 2]  # prompt ending with <|response|>
R = list(range(100, 119)) + [EOS]  # 20 response tokens
E = Example(P + R, len(P), "x")
ORIG = P + R  # logical sequence


def _check_convention(inst: corrupt.Instance, orig: list[int]) -> None:
    n_p = len(P)
    assert inst.ids[:n_p] == P and inst.pos[:n_p] == list(range(n_p))  # prompt first, clean, in order
    assert sorted(inst.pos) == list(range(len(orig)))  # every logical position exactly once
    is_mask = [x == MASK for x in inst.ids]
    first_mask = is_mask.index(True) if any(is_mask) else len(inst.ids)
    assert all(is_mask[first_mask:])  # masks after every clean token
    mpos = inst.pos[first_mask:]
    assert mpos == sorted(mpos)  # masked keep their relative order
    for i, (x, p, lab, k) in enumerate(zip(inst.ids, inst.pos, inst.labels, inst.kind, strict=True)):
        if x == MASK:
            assert k == corrupt.MDM and lab == orig[p]  # output at a mask predicts its own position
        else:
            assert x == orig[p]  # clean tokens carry their original token and logical position
            if lab != -100:
                assert k == corrupt.ARM and lab == orig[p + 1]  # clean: next logical token
                assert inst.pos[i + 1] == p + 1 and inst.ids[i + 1] == orig[p + 1]  # ... inside its slot/run


@pytest.mark.parametrize("seed", range(40))
def test_hybrid_instance(seed):
    rng = random.Random(seed)
    inst = corrupt.hybrid(E, rng, MASK, EOS, [4, 8], eos_pad_max=0)
    _check_convention(inst, ORIG)
    n_p, k = len(P), inst.slot_size
    assert k in (4, 8)
    clean = [(i, p) for i, (x, p) in enumerate(zip(inst.ids, inst.pos, strict=True)) if i >= n_p and x != MASK]
    # clean tokens come as whole slots: contiguous physically, consecutive logical positions
    for i, p in clean:
        j = (p - n_p) % k
        if j and p != n_p + len(R):
            assert inst.pos[i - 1] == p - 1
    slots = {(p - n_p) // k for _, p in clean}
    masked = {(p - n_p) // k for x, p in zip(inst.ids, inst.pos, strict=True) if x == MASK}
    assert not slots & masked and len(masked) == int(inst.t * -(-len(R) // k))


def test_hybrid_slot_masking_ratio():
    rng = random.Random(0)
    for _ in range(50):
        inst = corrupt.hybrid(E, rng, MASK, EOS, [4], eos_pad_max=0)
        K = 5
        assert sum(x == MASK for x in inst.ids) == 4 * int(inst.t * K)
        # last token of each clean slot has no label (j = 2..k only)
        for i in range(len(P), len(inst.ids)):
            if inst.ids[i] != MASK and (inst.pos[i] - len(P)) % 4 == 3:
                assert inst.labels[i] == -100


@pytest.mark.parametrize("seed", range(20))
def test_token_reorder_and_bidirectional(seed):
    inst = corrupt.token_reorder(E, random.Random(seed), MASK, EOS)
    _check_convention(inst, ORIG)
    b = corrupt.bidirectional(E, random.Random(seed), MASK, EOS)
    assert b.pos == list(range(len(ORIG)))
    for x, p, lab in zip(b.ids, b.pos, b.labels, strict=True):
        assert (lab == orig_at(p)) if x == MASK else (lab == -100 and x == orig_at(p))
    assert MASK in b.ids


def orig_at(p: int) -> int:
    return ORIG[p]


def test_batches_weights():
    ex = [E, Example([5, 6, 7, 8, 9, 10, 11, 12], 0, "text")]
    b = make_hybrid_batch(ex, random.Random(1), mask_id=MASK, eos_id=EOS, slot_sizes=[4], eos_pad_max=3)
    assert b.attention_mask.dtype == torch.long and b.position_ids.shape == b.input_ids.shape
    sel = b.labels != -100
    kinds = b.input_ids[sel] == MASK
    if kinds.any() and (~kinds).any():
        assert torch.isclose(b.weights[sel].sum(), torch.tensor(2.0))  # mean ARM + 1.0 * mean MDM
    m = make_mdm_batch(ex, random.Random(1), mask_id=MASK, eos_id=EOS)
    assert ((m.weights > 0) == (m.input_ids == MASK)).all()
