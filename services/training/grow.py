"""Function-preserving growth of a small Qwen3 into a wider and deeper one (Net2Net-style): the large model starts
with the small one's circuits instead of from scratch.

hidden_size, intermediate_size and head_dim may grow (by an integer factor for head_dim); head counts, vocabulary
and rope stay. Extra layers are interleaved as identities (zero output projections). New weights get `noise`-sized
values so they receive gradients; with noise=0 the grown model computes the small one's logits.
"""

import math

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

SAME = ("num_attention_heads", "num_key_value_heads", "vocab_size", "tie_word_embeddings", "rope_parameters")


def check(small: Qwen3Config, big: Qwen3Config) -> None:
    for key in SAME:
        if getattr(small, key) != getattr(big, key):
            raise ValueError(f"grow keeps {key}: {getattr(small, key)} != {getattr(big, key)}")
    for key in ("hidden_size", "intermediate_size", "head_dim", "num_hidden_layers"):
        if getattr(big, key) < getattr(small, key):
            raise ValueError(f"grow cannot shrink {key}: {getattr(small, key)} > {getattr(big, key)}")
    if big.head_dim % small.head_dim:
        raise ValueError(f"head_dim {big.head_dim} must be a multiple of {small.head_dim}")


def head_index(d: int, D: int) -> torch.Tensor:
    """Where dim i of a d-wide head goes in a D-wide one so that RoPE rotates it by the same frequency:
    pairs (i, i + d/2) at theta^(-2i/d) land on (ri, ri + D/2) at theta^(-2ri/D), r = D/d."""
    r, half = D // d, torch.arange(d // 2)
    return torch.cat([half * r, half * r + D // 2])


def heads(n: int, d: int, D: int) -> torch.Tensor:
    """Row indices in a [n*D, .] projection of the rows of an [n*d, .] one."""
    return (torch.arange(n)[:, None] * D + head_index(d, D)[None, :]).reshape(-1)


def layer_map(n_small: int, n_big: int) -> list[int]:
    """Index in the big model of each small layer; the others are identities spread between them."""
    return [i * n_big // n_small for i in range(n_small)]


@torch.no_grad()
def grow(small: Qwen3ForCausalLM, config: Qwen3Config, noise: float = 1e-3, seed: int = 0) -> Qwen3ForCausalLM:
    s, b = small.config, config
    check(s, b)
    torch.manual_seed(seed)
    big = Qwen3ForCausalLM(config).float()
    h, H, d, D = s.hidden_size, b.hidden_size, s.head_dim, b.head_dim
    rows_q = heads(s.num_attention_heads, d, D)
    rows_kv = heads(s.num_key_value_heads, d, D)
    norm_scale = math.sqrt(h / H)  # RMS over H dims of an h-dim vector padded with zeros is sqrt(h/H) of its own
    big.model.embed_tokens.weight.normal_(0, noise)[:, :h] = small.model.embed_tokens.weight
    big.model.norm.weight.fill_(norm_scale)
    for i, j in enumerate(layer_map(s.num_hidden_layers, b.num_hidden_layers)):
        src, dst = small.model.layers[i], big.model.layers[j]
        for name in ("input_layernorm", "post_attention_layernorm"):
            getattr(dst, name).weight.fill_(norm_scale)
            getattr(dst, name).weight[:h] *= getattr(src, name).weight
        for name, rows in (("q_proj", rows_q), ("k_proj", rows_kv), ("v_proj", rows_kv)):
            w = getattr(dst.self_attn, name).weight.normal_(0, noise)
            w[rows, :h] = getattr(src.self_attn, name).weight
        big_o = dst.self_attn.o_proj.weight.normal_(0, noise)
        big_o[:h, rows_q] = src.self_attn.o_proj.weight
        # the RMS over D dims scales normed q and k each by sqrt(r), the score scaling by 1/sqrt(r): k takes 1/sqrt(r)
        r = D // d
        dst.self_attn.q_norm.weight.fill_(1.0)[head_index(d, D)] = src.self_attn.q_norm.weight
        dst.self_attn.k_norm.weight.fill_(1.0)[head_index(d, D)] = src.self_attn.k_norm.weight / math.sqrt(r)
        for name in ("gate_proj", "up_proj"):
            getattr(dst.mlp, name).weight.normal_(0, noise)[: s.intermediate_size, :h] = getattr(src.mlp, name).weight
        dst.mlp.down_proj.weight.normal_(0, noise)[:h, : s.intermediate_size] = src.mlp.down_proj.weight
    for j in set(range(b.num_hidden_layers)) - set(layer_map(s.num_hidden_layers, b.num_hidden_layers)):
        big.model.layers[j].self_attn.o_proj.weight.normal_(0, noise)
        big.model.layers[j].mlp.down_proj.weight.normal_(0, noise)
    big.model.norm.weight[:h] *= small.model.norm.weight
    return big
