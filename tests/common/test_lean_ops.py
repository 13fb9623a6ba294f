"""The lean decoder's ops give transformers' modules' results bit for bit (tokens do not move with the change of
forward): RMSNorm over the hidden size and per head, rotary from the precomputed tables."""

import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding, apply_rotary_pos_emb

from services.common.lean_ops import rms_norm, rotary, rotary_tables

HEADS, D = 6, 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_transformers_rmsnorm(dtype):
    torch.manual_seed(0)
    x = (torch.randn(37, HEADS, D) * 3).to(dtype)
    norm = Qwen3RMSNorm(D, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(D) + 0.5)
        assert torch.equal(rms_norm(x, norm.weight, 1e-6), norm(x))
        per_head = norm.weight.expand(HEADS, -1)  # the joint q/k norm's [heads, D] weight
        assert torch.equal(rms_norm(x, per_head, 1e-6), norm(x))


def test_rotary_from_the_tables_is_transformers_rotary():
    torch.manual_seed(0)
    rope = Qwen3RotaryEmbedding(Qwen3Config(head_dim=D, max_position_embeddings=512))
    x = torch.randn(29, HEADS, D)
    positions = torch.randint(0, 512, (29,))  # any order: a cache in commit order
    cos, sin = rope(x, positions[None])  # [1, T, D]
    expected, _ = apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None], cos, sin)
    table_cos, table_sin = rotary_tables(*(t[0] for t in rope(x, torch.arange(512)[None])))
    got = rotary(x, table_cos[positions][:, None], table_sin[positions][:, None])
    assert torch.equal(got, expected[0].transpose(0, 1))
