"""The hosts' decoder, in the spirit of nano-vllm's models/qwen3.py: a Qwen3 / Qwen2 / Llama causal LM's weights,
read once at load (lean_load.py), fused where one matmul does the work of several (q, k and v; gate and up), and a
forward of plain tensor ops over a packed row of tokens, attention per request (packed_attention.py). Its linears and
what runs between them are `ops` (lean_ops.Ops): torch's, or in float32 on the CPU C++ kernels (cpu_kernels.py). No
module stack, no kwargs, no mask built per layer. It computes what transformers' modules compute, so its logits are
transformers' within float tolerance (tests/common/test_lean_model.py, test_lean_ops.py, test_lean_load.py,
test_cpu_kernels.py).

Shapes: Q tokens in the packed row, H hidden, Hq query heads and Hkv KV heads of D, I the MLP's width, V the
vocabulary, P the positions the rotary tables cover.
"""

from dataclasses import dataclass

import torch

from services.common import flops
from services.common.lean_ops import Ops, Weight
from services.common.packed_attention import Segment


@dataclass(frozen=True, slots=True)
class Layer:
    attn_norm: torch.Tensor  # [H]
    qkv: Weight  # [(Hq + 2 Hkv) D, H]: q_proj, k_proj, v_proj stacked; each linear's weight as ops.pack made it
    qkv_bias: torch.Tensor | None  # [(Hq + 2 Hkv) D] (Qwen2); None without
    qk_norm: torch.Tensor | None  # [Hq + Hkv, D]: q_norm's weight on each query head, k_norm's on each KV head (Qwen3)
    o: Weight  # [H, Hq D]
    o_bias: torch.Tensor | None  # [H] (Llama with attention_bias)
    mlp_norm: torch.Tensor  # [H]
    gate_up: Weight  # [2 I, H]: gate_proj, up_proj stacked
    down: Weight  # [H, I]


@dataclass(frozen=True, slots=True)
class LeanModel:
    embedding: torch.Tensor  # [V, H]
    layers: tuple[Layer, ...]
    norm: torch.Tensor  # [H], the final RMSNorm
    head: Weight  # [V, H], the embedding itself when tied (under torch's ops)
    cos: torch.Tensor  # [P, D] rotary tables (lean_ops.rotary_tables)
    sin: torch.Tensor  # [P, D]
    heads: int  # Hq
    kv_heads: int  # Hkv
    head_dim: int  # D
    eps: float
    causal: bool  # False: new tokens see each other both ways (bidirectional drafters)
    ops: Ops  # the linears, and the norms, rotary, SwiGLU and attention between them

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    def decode(
        self, hidden: torch.Tensor, positions: torch.Tensor, segments: list[Segment], rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """hidden [Q, H], the packed row's input embeddings at positions [Q] -> the last hidden states, before the
        final norm, of rows [R] (every row where None): [R, H]; each attention layer writes each segment's cache.
        Past the last layer's attention only those rows run, as llama.cpp's `inp_out_ids`: the others' outputs go
        nowhere (their keys and values are all the caches take), and each row's sums are its own, so the rows run
        come out bit for bit as in the whole forward."""
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [Q, 1, D], shared by every layer
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            x = self.ops.rms_norm(hidden, layer.attn_norm, self.eps)
            out = self.attention(layer, index, x, cos, sin, segments)  # [Q, Hq D]
            if index == last and rows is not None:
                hidden, out = hidden[rows], out[rows]
            hidden = hidden + self.ops.linear(out, layer.o, layer.o_bias)
            x = self.ops.rms_norm(hidden, layer.mlp_norm, self.eps)
            hidden = hidden + self.ops.linear(self.ops.swiglu(self.ops.linear(x, layer.gate_up)), layer.down)
        return hidden

    def attention(
        self, layer: Layer, index: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[Segment]
    ) -> torch.Tensor:
        """x [Q, H], normed -> the attention's output [Q, Hq D], before its output projection."""
        qkv = self.ops.linear(x, layer.qkv, layer.qkv_bias)  # [Q, (Hq + 2 Hkv) D]
        heads, d = self.heads + self.kv_heads, self.head_dim
        qk = qkv[:, : heads * d].unflatten(1, (heads, d))  # [Q, Hq + Hkv, D]: queries and keys, normed and rotated
        qk = self.ops.qk_norm_rotary(qk, layer.qk_norm, cos, sin, self.eps)  # together
        value = qkv[:, heads * d :].unflatten(1, (self.kv_heads, d))  # [Q, Hkv, D]
        return self.ops.attend(qk[:, : self.heads], qk[:, self.heads :], value, segments, index, d**-0.5)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [R, H], rows of decode's output -> float32 logits [R, V]."""
        return self.ops.linear(self.ops.rms_norm(hidden, self.norm, self.eps), self.head).float()

    def flops(self, tokens: int, attended: int, rows: int) -> int:
        linear = sum(w.numel() for layer in self.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down))
        last = self.layers[-1]
        tail = sum(w.numel() for w in (last.o, last.gate_up, last.down))
        width = len(self.layers) * self.heads * self.head_dim
        return flops.forward_flops(linear, tail, width, self.head.numel(), tokens, attended, rows)
