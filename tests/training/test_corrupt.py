import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from services.training import corrupt
from services.training.dataset import Example
from services.training.drafter import make_hybrid_batch, make_mdm_batch
from tests import tiny

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
    B, T = b.input_ids.shape
    assert b.attention_mask.shape == (B, 1, T, T) and b.position_ids.shape == b.input_ids.shape
    assert torch.equal(b.attention_mask[0, 0], torch.ones(T, T, dtype=torch.bool).tril())  # longest row: causal
    sel = b.labels != -100
    kinds = b.input_ids[sel] == MASK
    if kinds.any() and (~kinds).any():
        assert torch.isclose(b.weights[sel].sum(), torch.tensor(2.0))  # mean ARM + 1.0 * mean MDM
    m = make_mdm_batch(ex, random.Random(1), mask_id=MASK, eos_id=EOS)
    assert ((m.weights > 0) == (m.input_ids == MASK)).all()


@pytest.mark.parametrize("seed", range(20))
def test_dual_stream_instance(seed):
    inst = corrupt.dual_stream(E, random.Random(seed), MASK, EOS, block_size=8)
    L = len(ORIG)
    assert inst.ids[:L] == ORIG and inst.pos[:L] == list(range(L)) and inst.n_prompt == L  # clean memory stream
    assert inst.labels[len(P) - 1 : L - 1] == R and inst.block[:L] == [-1] * L  # AR labels on the response
    pred = list(zip(inst.ids[L:], inst.pos[L:], inst.labels[L:], inst.block[L:], strict=True))
    assert sorted(p for _, p, _, _ in pred) == list(range(len(P), L))  # each response position once
    starts = sorted(set(inst.block[L:]))
    assert all(b - a == 8 for a, b in zip(starts[1:], starts[2:], strict=False))  # first block random, then B
    for s in starts:
        blk = [(x, p, lab) for x, p, lab, b in pred if b == s]
        masks = [x == MASK for x, _, _ in blk]
        assert any(masks) and masks == sorted(masks)  # observed first, masked after (4.1 within the block)
        assert all(s <= p < s + 8 for _, p, _ in blk)
        for x, p, lab in blk:
            assert lab == (ORIG[p] if x == MASK else -100) and (x == MASK or x == ORIG[p])


def test_dual_stream_visibility():
    inst = corrupt.dual_stream(E, random.Random(3), MASK, EOS, block_size=8)
    vis, L = corrupt.visible(inst), len(ORIG)
    assert torch.equal(vis[:L, :L], torch.ones(L, L, dtype=torch.bool).tril())  # memory: plain causal
    for i in range(L, len(inst.ids)):
        s = inst.block[i]
        seen = vis[i].nonzero().squeeze(-1).tolist()
        memory = [j for j in seen if j < L]
        own = [j for j in seen if j >= L]
        assert memory == list(range(s))  # clean history before the block, nothing of its own positions
        assert own == [j for j in range(L, i + 1) if inst.block[j] == s]  # its block, causally; no earlier blocks


def test_dual_stream_matches_inference_layout(tmp_path):
    """A fully masked block sees exactly what the causal drafter sees at decode time: prefix then masks."""
    path = tiny.causal_lm(str(tmp_path / "m"), tiny.tokenizer(str(tmp_path / "tok")), 0, "causal")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    rng = random.Random(0)
    rng.random = lambda: 0.0  # gamma = 1: every block fully masked
    inst = corrupt.dual_stream(E, rng, MASK, EOS, block_size=8)
    b = corrupt.collate([inst], "dual")
    with torch.no_grad():
        out = model(input_ids=b.input_ids, position_ids=b.position_ids, attention_mask=b.attention_mask).logits[0]
        L = len(ORIG)
        for s in sorted(set(inst.block[L:])):
            idx = [i for i in range(L, len(inst.ids)) if inst.block[i] == s]
            ids = torch.tensor([ORIG[:s] + [MASK] * len(idx)])
            ref = model(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None]).logits[0, s:]
            assert torch.allclose(out[idx], ref, atol=1e-4)


def test_dual_stream_weights():
    b = make_hybrid_batch(
        [E], random.Random(0), mask_id=MASK, eos_id=EOS, slot_sizes=[4], dual_stream_frac=1.0, dual_block_size=8
    )
    arm, mdm = b.weights[b.input_ids != MASK], b.weights[b.input_ids == MASK]
    assert torch.isclose(arm.sum(), torch.tensor(1.0))  # mean AR loss over the memory stream
    assert (mdm > 0).all() and (mdm >= 1 / len(R) - 1e-6).all()  # 1/gamma over prediction-stream tokens
