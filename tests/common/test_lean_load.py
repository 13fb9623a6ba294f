"""Loading the lean decoder: the fused projections are views the transformers modules share (one copy of the
weights), each module's output their matmul's own columns; what it does not compute is refused."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from services.common.lean_load import fuse, lean_model
from services.common.lean_ops import swiglu
from tests.tiny import qwen3_kwargs

V = 300


def test_fused_projections_give_each_module_its_own_output_and_share_its_weights():
    torch.manual_seed(0)
    gate, up = torch.nn.Linear(64, 96, bias=False), torch.nn.Linear(64, 96, bias=False)
    x = torch.randn(11, 64)
    with torch.no_grad():
        expected = torch.nn.functional.silu(gate(x)) * up(x)
        fused = fuse([gate, up])
        assert torch.equal(swiglu(torch.nn.functional.linear(x, fused)), expected)
    assert gate.weight.data_ptr() == fused.data_ptr()  # one copy of the weights
    assert up.weight.data_ptr() == fused[96:].data_ptr()


def test_the_loaded_models_projections_are_views_of_the_lean_weights():
    """Under torch's ops; the CPU kernels read a copy of their own (cpu_kernels.Panels)."""
    model = Qwen3ForCausalLM(Qwen3Config(**qwen3_kwargs(V))).eval()
    lean = lean_model(model, cpu_kernels=False)
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert attn.q_proj.weight.data_ptr() == lean.layers[1].qkv.data_ptr()
    assert attn.v_proj.weight.data_ptr() == lean.layers[1].qkv[-attn.v_proj.weight.shape[0] :].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == lean.layers[1].gate_up[mlp.gate_proj.weight.shape[0] :].data_ptr()
    assert lean.head.data_ptr() == lean.embedding.data_ptr()  # tied


def test_what_it_does_not_compute_is_refused():
    sliding = Qwen2Config(**qwen3_kwargs(V), use_sliding_window=True, sliding_window=4, max_window_layers=0)
    with pytest.raises(ValueError, match="sliding"):
        lean_model(Qwen2ForCausalLM(sliding))
    with pytest.raises(ValueError, match="MLP"):
        lean_model(LlamaForCausalLM(LlamaConfig(**qwen3_kwargs(V), mlp_bias=True)))
