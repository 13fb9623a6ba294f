"""The fused CPU kernels (services/common/cpu_kernels.cpp) compute what the lean decoder's torch ops compute
(lean_ops.TORCH_OPS): the linears, norms and attention within float rounding (their sums in another order; attention
with the same cache writes), SwiGLU bit for bit (the same vectorised exp), and the proposals' and verdicts' maths over
the logits with the same tokens and the probabilities within float rounding. Each row's result is the same whatever
rows stand beside it, and the decoder takes them only for float32 on the CPU. The engine
decodes the same tokens with them as without (tests/common/test_lean_model.py checks the logits against
transformers)."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import DynamicCache

from services.common import cpu_kernels
from services.common.config import EngineConfig
from services.common.lean_ops import TORCH_OPS, rotary_tables
from services.common.packed_attention import Segment
from services.common.params import BENCH_PROMPTS
from services.common.sampling import SamplingParams
from services.common.threads import intra_op_threads
from services.orchestrator.engine.engine import Engine

EPS = 1e-6
HEADS, KV_HEADS, D = 4, 2, 64


@pytest.fixture(scope="module")
def kernels() -> cpu_kernels.CpuKernels:
    built = cpu_kernels.build()
    if built is None:
        pytest.skip("no C++ toolchain here: the decoder runs torch's ops")
    return cpu_kernels.CpuKernels(built)


def rows() -> torch.Tensor:
    """[40, 256]: normal rows, rows at a scale where eps counts (mean square ~ eps), and a zero row."""
    torch.manual_seed(0)
    x = torch.randn(40, 256) * 3
    x[10:20] *= 1e-3 / 3
    x[20] = 0
    return x


def test_rms_norm_is_the_torch_ops(kernels):
    x, weight = rows(), torch.rand(256) + 0.5
    got = kernels.rms_norm(x, weight, EPS)
    torch.testing.assert_close(got, TORCH_OPS.rms_norm(x, weight, EPS), rtol=2e-6, atol=1e-7)
    assert torch.equal(got[20], torch.zeros(256))


@pytest.mark.parametrize("normed", [True, False], ids=["qwen3", "no-qk-norm"])
def test_qk_norm_rotary_is_the_torch_ops(kernels, normed):
    """On queries and keys as the decoder has them: a view of the qkv projection, tokens at any positions."""
    torch.manual_seed(1)
    tokens = 29
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * D) * 2
    qk = qkv[:, : (HEADS + KV_HEADS) * D].unflatten(1, (HEADS + KV_HEADS, D))
    weight = torch.rand(HEADS + KV_HEADS, D) + 0.5 if normed else None
    angles = torch.arange(512)[:, None] * 10000 ** (-torch.arange(0, D, 2) / D)
    cos, sin = rotary_tables(torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin())
    positions = torch.randperm(512)[:tokens]
    cos, sin = cos[positions][:, None], sin[positions][:, None]
    got = kernels.qk_norm_rotary(qk, weight, cos, sin, EPS)
    torch.testing.assert_close(got, TORCH_OPS.qk_norm_rotary(qk, weight, cos, sin, EPS), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("width", [768, 37], ids=["vectors", "with-a-tail"])
def test_swiglu_is_the_torch_op_bit_for_bit(kernels, width):
    gate_up = torch.randn(30, 2 * width) * 4
    assert torch.equal(kernels.swiglu(gate_up), TORCH_OPS.swiglu(gate_up))


def packed_row(seed: int, d: int = D) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[Segment]]:
    """query [Q, H, d], key, value [Q, H_kv, d] and four segments: over a past with a mask, keep and rest; without a
    past, plainly causal; over a past without a mask (every key); a window of 26 over a past of 100 with its mask
    (a c=1 round's drafter: keys across two panels and a partial vector). The queries and keys are views into one
    projection, as the decoder has them."""
    torch.manual_seed(seed)
    segments, row = [], 0
    shapes = ((5, 3, 1, True, False), (0, 4, 4, False, True), (7, 2, 2, False, False), (100, 26, 26, True, False))
    for past, n, keep, masked, causal in shapes:
        cache = DynamicCache()
        if past:
            cache.update(torch.randn(1, KV_HEADS, past, d), torch.randn(1, KV_HEADS, past, d), 0)
        mask = None
        if masked:
            seen = torch.cat([torch.ones(n, past, dtype=torch.bool), (torch.rand(n, n) > 0.4) | torch.eye(n).bool()], 1)
            mask = torch.zeros(seen.shape).masked_fill(~seen, float("-inf"))
        segments.append(Segment(cache, slice(row, row + n), mask, keep, DynamicCache() if masked else None, causal))
        row += n
    qkv = torch.randn(row, HEADS + 2 * KV_HEADS, d)
    return qkv[:, :HEADS], qkv[:, HEADS : HEADS + KV_HEADS], qkv[:, HEADS + KV_HEADS :], segments


@pytest.mark.parametrize("d", [64, 32, 24], ids=["drafter", "guider", "a-head-dim-off-the-vectors"])
def test_attend_is_the_torch_ops_with_the_same_cache_writes(kernels, d):
    """Each segment's rows as SDPA gives them, and each cache (and rest) given exactly the past and new entries."""
    query, key, value, torch_segments = packed_row(3, d)
    *_, kernel_segments = packed_row(3, d)
    expected = TORCH_OPS.attend(query, key, value, torch_segments, 0, d**-0.5)
    got = kernels.attend(query, key, value, kernel_segments, 0, d**-0.5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=2e-6)
    for mine, theirs in zip(kernel_segments, torch_segments, strict=True):
        for cache, reference in ((mine.cache, theirs.cache), (mine.rest, theirs.rest)):
            if reference is not None:
                assert torch.equal(cache.layers[0].keys, reference.layers[0].keys)
                assert torch.equal(cache.layers[0].values, reference.layers[0].values)


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 26, 400])
@pytest.mark.parametrize(("out", "width"), [(1536, 256), (80, 100)], ids=["gate_up", "narrow-last-panel"])
def test_the_linear_is_torch_s(kernels, rows, out, width):
    """Over the panels (a last one narrower than the others where out is not a multiple of 64), with and without a
    bias, at row counts around the 6-row tiles."""
    torch.manual_seed(4)
    x, weight, bias = torch.randn(rows, width), torch.randn(out, width) / width**0.5, torch.randn(out)
    packed = kernels.pack(weight)
    assert isinstance(packed, cpu_kernels.Panels) and packed.numel() == weight.numel()
    torch.testing.assert_close(kernels.linear(x, packed), torch.nn.functional.linear(x, weight), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernels.linear(x, packed, bias), torch.nn.functional.linear(x, weight, bias))


def test_a_weight_the_kernel_does_not_take_stays_torch_s(kernels):
    weight, x = torch.randn(70, 32), torch.randn(3, 32)  # 70 rows: not a multiple of the vector width
    assert kernels.pack(weight) is weight
    assert torch.equal(kernels.linear(x, weight), torch.nn.functional.linear(x, weight))


def logits_with_traps(vocab: int, mask_id: int) -> torch.Tensor:
    """[40, vocab]: rows where the mask token's logit is the largest, banned tokens (-inf), a tie for the maximum
    (the first one counts) and a flat row."""
    torch.manual_seed(3)
    logits = torch.randn(40, vocab) * 4
    logits[:10, mask_id] = 30.0
    logits[10:20, vocab // 3 :: 5] = float("-inf")
    logits[20, [7, 9]] = 50.0
    logits[21] = 0.0
    return logits


@pytest.mark.parametrize(("vocab", "mask_id"), [(4096, 1), (4096, 0), (4103, 4102), (4096, -1)])
def test_the_logit_maths_are_the_torch_ops(kernels, vocab, mask_id):
    """What a proposal and a verdict read (proposal.LogitMaths): the same tokens, their probabilities and the
    entropies within float rounding, over vocabularies with a scalar tail, with or without a mask token."""
    logits = logits_with_traps(vocab, mask_id if mask_id >= 0 else 0)
    ids, probs, entropy = kernels.proposal_stats(logits, None, mask_id)
    want_ids, want_probs, want_entropy = TORCH_OPS.proposal_stats(logits, None, mask_id)
    assert torch.equal(ids, want_ids) and ids[20] == 7
    torch.testing.assert_close(probs, want_probs, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(entropy, want_entropy, rtol=1e-5, atol=1e-5)
    sampled = torch.randint(2, vocab, (40,))  # a sampled request's tokens, chosen before
    assert torch.equal(kernels.proposal_stats(logits, sampled, mask_id)[0], sampled)
    torch.testing.assert_close(
        kernels.proposal_stats(logits, sampled, mask_id)[1], TORCH_OPS.proposal_stats(logits, sampled, mask_id)[1]
    )
    draft = sampled.clone()
    draft[5] = max(mask_id, 0)  # a banned draft: no probability (a model without a mask token bans none)
    target, top, drafted = kernels.verdict_stats(logits, draft, mask_id)
    want_target, want_top, want_drafted = TORCH_OPS.verdict_stats(logits, draft, mask_id)
    assert torch.equal(target, want_target)
    torch.testing.assert_close(top, want_top, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(drafted, want_drafted, rtol=1e-5, atol=1e-7)


def test_a_row_does_not_depend_on_the_rows_beside_it(kernels):
    """600 rows run on every thread, 3 rows on one, a request's attention among three others and alone: the same bits
    for the same rows (batch invariance)."""
    torch.manual_seed(2)
    x, weight = torch.randn(600, 256), torch.rand(256)
    assert torch.equal(kernels.rms_norm(x, weight, EPS)[:3], kernels.rms_norm(x[:3], weight, EPS))
    gate_up = torch.randn(600, 1536)
    assert torch.equal(kernels.swiglu(gate_up)[:3], kernels.swiglu(gate_up[:3]))
    panels = kernels.pack(torch.randn(1536, 256))
    assert torch.equal(kernels.linear(x, panels)[:3], kernels.linear(x[:3], panels))
    query, key, value, segments = packed_row(5)
    whole = kernels.attend(query, key, value, segments, 0, D**-0.5)
    *_, alone = packed_row(5)
    window = alone[-1]
    rows = slice(window.new.start, window.new.stop)
    alone = [Segment(window.cache, slice(0, window.new.stop - window.new.start), window.mask, window.keep, window.rest)]
    assert torch.equal(whole[rows], kernels.attend(query[rows], key[rows], value[rows], alone, 0, D**-0.5))
    logits, picks = torch.randn(600, 4096), torch.randint(2, 4096, (600,))
    whole, alone = kernels.kernels.logit_stats(logits, 1, picks), kernels.kernels.logit_stats(logits[:3], 1, picks[:3])
    for many, three in zip(whole, alone, strict=True):
        assert torch.equal(many[:3], three)


def test_a_kernel_keeps_the_torch_threads_of_the_thread_it_runs_on(kernels):
    """The in-process executor's worker runs its forwards on 2 threads while the event loop's thread keeps 1: a kernel's
    first call on the worker must not reset the worker's team to the last count set anywhere."""
    worker, before = ThreadPoolExecutor(1), torch.get_num_threads()
    try:
        worker.submit(intra_op_threads, 2).result()
        intra_op_threads(1)
        x, weight = torch.randn(600, 256), torch.rand(256)
        assert worker.submit(lambda: (kernels.rms_norm(x, weight, EPS), torch.get_num_threads())[1]).result() == 2
    finally:
        worker.shutdown()
        intra_op_threads(before)


def test_a_tensor_the_kernels_do_not_take_is_refused_by_name(kernels):
    with pytest.raises(RuntimeError, match="x must be a float32 CPU tensor"):
        kernels.rms_norm(torch.randn(3, 256, dtype=torch.bfloat16), torch.rand(256), EPS)
    with pytest.raises(RuntimeError, match=r"weight must be \[256\]"):
        kernels.rms_norm(torch.randn(3, 256), torch.rand(128), EPS)
    with pytest.raises(RuntimeError, match="logits must be a float32 CPU tensor"):
        kernels.proposal_stats(torch.randn(3, 256, dtype=torch.float64), None, 1)
    with pytest.raises(RuntimeError, match="mask_id 256 leaves no token of 256"):
        kernels.proposal_stats(torch.randn(3, 256), None, 256)
    with pytest.raises(RuntimeError, match=r"panels must be pack_linear's of a \[64, 32\] weight"):
        kernels.kernels.linear(torch.randn(3, 32), torch.randn(64 * 31), 64, None)
    with pytest.raises(RuntimeError, match=r"bias must be \[64\]"):
        kernels.kernels.linear(torch.randn(3, 32), torch.randn(64 * 32), 64, torch.randn(63))
    q, k, v, past = (
        torch.randn(3, HEADS, D),
        torch.randn(3, KV_HEADS, D),
        torch.randn(3, KV_HEADS, D),
        torch.randn(1, KV_HEADS, 5, D),
    )
    with pytest.raises(RuntimeError, match=r"segment 0's mask must be \[3, 8\]"):
        kernels.kernels.attend(q, k, v, [0], [3], [past], [past], [torch.zeros(3, 7)], [False], 1.0)
    with pytest.raises(RuntimeError, match="segment 0 is causal over a past: give its mask instead"):
        kernels.kernels.attend(q, k, v, [0], [3], [past], [past], [None], [True], 1.0)
    with pytest.raises(RuntimeError, match="segment 0 is causal over a past: give its mask instead"):  # through SDPA
        off = (q[..., :24], k[..., :24], v[..., :24], [0], [3], [past[..., :24]], [past[..., :24]], [None], [True])
        kernels.kernels.attend(*off, 1.0)
    with pytest.raises(RuntimeError, match="segment 0 has a past of one of keys and values only"):
        kernels.kernels.attend(q, k, v, [0], [3], [past], [None], [None], [False], 1.0)
    with pytest.raises(RuntimeError, match=r"segment 0's rows \[0, 4\) are not within the 3 tokens"):
        kernels.kernels.attend(q, k, v, [0], [4], [past], [past], [None], [False], 1.0)
    with pytest.raises(RuntimeError, match="picks must be token ids below 256"):
        kernels.verdict_stats(torch.randn(3, 256), torch.tensor([4, 256, 5]), 1)


def test_the_decoder_takes_the_kernels_for_float32_on_the_cpu_only(kernels):
    cpu = torch.device("cpu")
    assert isinstance(cpu_kernels.ops_for(cpu, torch.float32), cpu_kernels.CpuKernels)
    assert cpu_kernels.ops_for(cpu, torch.bfloat16) is TORCH_OPS
    assert cpu_kernels.ops_for(cpu, torch.float32, fused=False) is TORCH_OPS
    assert cpu_kernels.ops_for(torch.device("cuda"), torch.float32) is TORCH_OPS


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "seeded"])
@pytest.mark.parametrize("strategy", ["pipeline", "ar"])
def test_the_engine_decodes_the_same_tokens_with_the_kernels(kernels, strategy, temperature):
    """The shipped models, four bench prompts at once: engine.cpu_kernels on and off give the same tokens."""
    outputs, sampling = {}, SamplingParams(temperature=temperature, seed=7)
    for fused in (True, False):
        engine = Engine(EngineConfig.from_yaml(cpu_kernels=fused, strategy=strategy, max_new_tokens=32))
        assert isinstance(engine.executor.load("drafter").decoder.ops, cpu_kernels.CpuKernels) == fused
        outputs[fused] = [out.token_ids for out in engine.generate(list(BENCH_PROMPTS[:4]), sampling=sampling)]
    assert outputs[True] == outputs[False]
