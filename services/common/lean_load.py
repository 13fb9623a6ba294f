"""A loaded transformers Qwen3 / Qwen2 / Llama causal LM -> the lean decoder's weights (lean_model.py), once at load.

The fused projections are one copy of the weights: the transformers modules' q/k/v and gate/up weights become views
of them, so the model (kept for training-side evaluation and tests) costs no second copy under torch's ops. The CPU
kernels read each linear's weight from a copy of their own (cpu_kernels.Panels: the model's size again). Everything
else is the model's own tensors, on its device and in its dtype."""

import torch
from torch import nn
from transformers import LlamaForCausalLM, PreTrainedModel, Qwen2ForCausalLM, Qwen3ForCausalLM

from services.common.cpu_kernels import ops_for
from services.common.lean_model import Layer, LeanModel
from services.common.lean_ops import Ops, rotary_tables

FAMILIES = (Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM)
ROPE_BY_LENGTH = ("dynamic", "longrope")  # inverse frequencies that change with the sequence: no fixed table


@torch.no_grad()
def lean_model(model: PreTrainedModel, cpu_kernels: bool = True) -> LeanModel:
    """cpu_kernels: the fused kernels where the model is float32 on the CPU (cpu_kernels.py); torch's ops if False."""
    check(model)
    base, cfg = model.base_model, model.config
    attn = base.layers[0].self_attn
    cos, sin = rotary_tables(*transformers_rotary(model))
    ops = ops_for(base.embed_tokens.weight.device, base.embed_tokens.weight.dtype, cpu_kernels)
    return LeanModel(
        embedding=base.embed_tokens.weight,
        layers=tuple(layer_of(decoder, ops) for decoder in base.layers),
        norm=base.norm.weight,
        head=ops.pack(model.get_output_embeddings().weight),
        cos=cos,
        sin=sin,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=attn.head_dim,
        eps=base.norm.variance_epsilon,
        causal=getattr(cfg, "is_causal", True),
        ops=ops,
    )


def check(model: PreTrainedModel) -> None:
    """Refuse what the lean decoder does not compute, rather than approximate it."""
    cfg = model.config
    if type(model) not in FAMILIES:
        raise ValueError(f"the lean decoder runs {[f.__name__ for f in FAMILIES]}, not {type(model).__name__}")
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
        raise ValueError("the lean decoder has no sliding-window attention")
    if getattr(cfg, "mlp_bias", False) or cfg.hidden_act != "silu":
        raise ValueError("the lean decoder's MLP is SwiGLU without biases")
    if model.base_model.rotary_emb.rope_type in ROPE_BY_LENGTH:
        raise ValueError(f"the lean decoder has no {model.base_model.rotary_emb.rope_type} RoPE")
    attn = model.base_model.layers[0].self_attn
    if attn.scaling != attn.head_dim**-0.5:
        raise ValueError("the lean decoder scales attention by head_dim ** -0.5")


def transformers_rotary(model: PreTrainedModel) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' own cos, sin [P, D] for positions 0 .. max_position_embeddings - 1, in the model's dtype."""
    weight = model.base_model.embed_tokens.weight
    positions = torch.arange(model.config.max_position_embeddings, device=weight.device)[None]
    cos, sin = model.base_model.rotary_emb(weight[:1], positions)
    return cos[0], sin[0]


def layer_of(decoder: nn.Module, ops: Ops) -> Layer:
    attn, mlp = decoder.self_attn, decoder.mlp
    qk_norm = None
    if hasattr(attn, "q_norm"):  # Qwen3: one weight per query head and per KV head, in qkv's order
        heads, kv_heads = attn.config.num_attention_heads, attn.config.num_key_value_heads
        qk_norm = torch.cat([attn.q_norm.weight.expand(heads, -1), attn.k_norm.weight.expand(kv_heads, -1)])
    return Layer(
        attn_norm=decoder.input_layernorm.weight,
        qkv=ops.pack(fuse([attn.q_proj, attn.k_proj, attn.v_proj])),
        qkv_bias=fuse([attn.q_proj, attn.k_proj, attn.v_proj], "bias") if attn.q_proj.bias is not None else None,
        qk_norm=qk_norm,
        o=ops.pack(attn.o_proj.weight),
        o_bias=attn.o_proj.bias,
        mlp_norm=decoder.post_attention_layernorm.weight,
        gate_up=ops.pack(fuse([mlp.gate_proj, mlp.up_proj])),
        down=ops.pack(mlp.down_proj.weight),
    )


def fuse(linears: list[nn.Linear], name: str = "weight") -> torch.Tensor:
    """The weights [out_i, H] (or biases [out_i]) stacked into one [sum out_i, H]; each module's becomes a view of its
    rows."""
    fused = torch.cat([getattr(m, name) for m in linears])
    start = 0
    for m in linears:
        rows = getattr(m, name).shape[0]
        setattr(m, name, nn.Parameter(fused[start : start + rows], requires_grad=False))
        start += rows
    return fused
