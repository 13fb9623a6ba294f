import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from services.training.grow import grow, head_index, layer_map
from services.training.train_loop import TrainConfig, build_model
from tests.tiny import qwen3_kwargs

SMALL = qwen3_kwargs(300, 32, num_attention_heads=2, num_key_value_heads=1)
BIG = dict(SMALL, hidden_size=64, intermediate_size=160, num_hidden_layers=3, head_dim=32)


def small_model(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**SMALL)).eval()
    for name, p in model.named_parameters():
        if "norm" in name:  # trained norms are not all ones
            p.data.uniform_(0.5, 1.5)
    return model


def test_grown_model_computes_the_small_one():
    small = small_model()
    big = grow(small, Qwen3Config(**BIG), noise=0.0).eval()
    ids = torch.randint(0, 300, (2, 24))
    with torch.no_grad():  # not exact only through the RMSNorm eps
        assert torch.allclose(big(input_ids=ids).logits, small(input_ids=ids).logits, atol=2e-3)
    noisy = grow(small, Qwen3Config(**BIG), noise=1e-3).eval()
    with torch.no_grad():
        gap = (noisy(input_ids=ids).logits - small(input_ids=ids).logits).abs().max()
    assert 0 < gap < 0.1


def test_new_weights_learn():
    big = grow(small_model(), Qwen3Config(**BIG), noise=1e-3)
    big(input_ids=torch.randint(0, 300, (2, 16)), labels=torch.randint(0, 300, (2, 16))).loss.backward()
    q = big.model.layers[0].self_attn.q_proj.weight.grad
    new_rows = torch.ones(q.shape[0], dtype=torch.bool)
    new_rows[torch.cat([head_index(16, 32), head_index(16, 32) + 32])] = False
    assert q[new_rows].abs().sum() > 0 and q[:, 32:].abs().sum() > 0


def test_layout_helpers():
    assert head_index(4, 8).tolist() == [0, 2, 4, 6]  # pairs (0,2),(1,3) -> (0,4),(2,6): same RoPE frequencies
    assert layer_map(4, 6) == [0, 1, 3, 4]


@pytest.mark.parametrize("key,value", [("num_attention_heads", 4), ("hidden_size", 16), ("head_dim", 24)])
def test_grow_rejects(key, value):
    with pytest.raises(ValueError, match=key):
        grow(small_model(), Qwen3Config(**dict(BIG, **{key: value})))


def test_train_config_grow_from(tmp_path):
    small_model().save_pretrained(tmp_path / "small")
    model = {k: BIG[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "head_dim")}
    model.update(num_attention_heads=2, num_key_value_heads=1)
    cfg = TrainConfig(name="big", grow_from=str(tmp_path / "small"), model=model)
    tok = type("Tok", (), {"__len__": lambda self: 300, "eos_token_id": 0, "pad_token_id": 0})()
    big = build_model(cfg, tok)
    assert big.config.hidden_size == 64 and big.config.num_hidden_layers == 3
    with pytest.raises(ValueError, match="exclusive"):
        TrainConfig(name="x", grow_from="a", init_from="b")
