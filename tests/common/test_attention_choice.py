"""A packed forward runs SDPA per request over that request's own cache (packed_attention.attend), never one of
transformers' attention functions, even on CUDA with flash-attn installed: flash-attn's varlen path ignores the
per-request segments and would let one request attend to another's tokens."""

import importlib.machinery
import importlib.util

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from services.common.batch import Item, forward
from services.common.models import load_model


def flash_looks_installed(monkeypatch) -> None:
    """flash-attn importable, transformers accepting it, and a model's move to CUDA kept on the CPU."""
    find_spec = importlib.util.find_spec
    fake = importlib.machinery.ModuleSpec("flash_attn", None)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: fake if name == "flash_attn" else find_spec(name, *a)
    )
    monkeypatch.setattr(
        PreTrainedModel, "_check_and_adjust_attn_implementation", lambda self, impl, *a, **k: impl or "sdpa"
    )
    to = torch.nn.Module.to
    monkeypatch.setattr(
        torch.nn.Module, "to", lambda self, *a, **k: self if "cuda" in map(str, a) else to(self, *a, **k)
    )


def test_a_packed_forward_on_cuda_runs_sdpa_per_request(tiny_zoo, monkeypatch):
    flash_looks_installed(monkeypatch)
    transformers_calls, queries = [], []
    for name in ("flash_attention_2", "sdpa"):

        def spy(*args, _name=name, _original=ALL_ATTENTION_FUNCTIONS[name], **kwargs):
            transformers_calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, name, spy)
    sdpa = F.scaled_dot_product_attention

    def per_request(query, *args, **kwargs):
        queries.append(query.shape[2])  # [1, heads, q_i, D]: one request's queries
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", per_request)
    for role in ("guider", "ar", "drafter"):
        queries.clear()
        # the weights stay on the CPU here: cpu_kernels=False is what the decoder takes on a real CUDA device
        loaded = load_model(tiny_zoo[role], device="cuda", cpu_kernels=False)
        items = [Item(DynamicCache(), [5, 9, 11], [0, 1, 2], 3), Item(DynamicCache(), [7, 3], [0, 1], 2)]
        forward(loaded.decoder, items)
        layers = loaded.model.config.num_hidden_layers
        assert not transformers_calls, (role, transformers_calls)
        assert queries == [3, 2] * layers, (role, queries)
