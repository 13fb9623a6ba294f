"""The tensor ops of the lean decoder (lean_model.py), each equal element for element to what transformers' Qwen3 /
Qwen2 / Llama modules compute, in fewer ops: checked bit for bit in fp32 (tests/common/test_lean_ops.py).

`Ops` is what the decoder computes with, its linears and what runs between them, and what its callers read of its
logits (proposal.LogitMaths): these torch ops (TORCH_OPS), or on the CPU in float32 the same maths as C++ kernels
(cpu_kernels.py)."""

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from services.common import packed_attention
from services.common.packed_attention import Segment
from services.common.proposal import LogitMaths, TorchLogitMaths


class Weight(Protocol):
    """A linear's weight as Ops.pack made it: the [N, K] tensor itself (torch's ops), or the kernels' panels."""

    def numel(self) -> int: ...


class Ops(LogitMaths, Protocol):
    def pack(self, weight: Tensor) -> Weight:
        """A linear's weight [N, K], once at load -> the form linear() reads."""
        ...

    def linear(self, x: Tensor, weight: Weight, bias: Tensor | None = None) -> Tensor:
        """x [M, K] -> x W^T + bias, [M, N]."""
        ...

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """x [N, H] over its last dim, times weight [H]."""
        ...

    def qk_norm_rotary(self, qk: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
        """qk [T, heads, D], each head normed by its row of weight [heads, D] (where the model has q/k norms), then
        rotated by cos, sin [T, 1, D] (rotary_tables at the tokens' positions) -> [T, heads, D]."""
        ...

    def swiglu(self, gate_up: Tensor) -> Tensor:
        """gate_up [T, 2I] -> [T, I]."""
        ...

    def attend(
        self, query: Tensor, key: Tensor, value: Tensor, segments: list[Segment], layer: int, scale: float
    ) -> Tensor:
        """packed_attention.attend: query [Q, H, D]; key, value [Q, H_kv, D] -> [Q, H D], writing each cache."""
        ...


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] over its last dim, times weight (broadcast against x: [D], or [heads, D] for x [T, heads, D]).

    As transformers' RMSNorm: normalised in float32, cast back to x's dtype, then times the weight. In float32 with
    a [D] weight that is one fused op (F.rms_norm gives the same bits as the five-op form)."""
    if x.dtype == torch.float32 and weight.dim() == 1:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype) * weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] at T positions whose tables are cos, sin [T, 1, D] -> x rotated, [T, heads, D].

    transformers computes x cos + rotate_half(x) sin with rotate_half(x) = [-x2, x1] (x1, x2 the halves of D).
    roll(x, D/2) is [x2, x1]; with sin's first half negated at load (rotary_tables) that is the same sum, term for
    term: (-x2) s == x2 (-s) exactly."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I], the gate and up projections side by side -> silu(gate) * up, [T, I]."""
    gate, up = gate_up.chunk(2, -1)
    return F.silu(gate) * up


def rotary_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' tables [P, D] (cos, sin of cat(freqs, freqs)) -> rotary()'s: cos, and sin with its first half
    negated."""
    half = sin.shape[-1] // 2
    return cos, torch.cat([-sin[:, :half], sin[:, half:]], -1)


class TorchOps(TorchLogitMaths):
    """Ops as the functions above: any device and dtype."""

    rms_norm = staticmethod(rms_norm)
    swiglu = staticmethod(swiglu)
    attend = staticmethod(packed_attention.attend)

    @staticmethod
    def pack(weight: Tensor) -> Tensor:
        return weight

    @staticmethod
    def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        return F.linear(x, weight, bias)  # looked up at each call, where a profiler's hook meets it

    @staticmethod
    def qk_norm_rotary(qk: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
        return rotary(qk if weight is None else rms_norm(qk, weight, eps), cos, sin)


TORCH_OPS = TorchOps()
