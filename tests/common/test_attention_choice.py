"""A packed forward runs packed_sdpa, never flash_attention_2, even on CUDA with flash-attn installed: flash-attn's
varlen path ignores the per-request segments and would let one request attend to another's tokens."""

import importlib.machinery
import importlib.util

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from services.common.batch import Item, forward
from services.common.models import load_model
from services.common.packed_attention import PACKED_SDPA, packed_sdpa


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


def test_a_packed_forward_on_cuda_runs_packed_sdpa_with_its_segments(tiny_zoo, monkeypatch):
    flash_looks_installed(monkeypatch)
    calls = []

    def flash(*args, **kwargs):
        calls.append("flash_attention_2")
        return ALL_ATTENTION_FUNCTIONS["sdpa"](*args, **kwargs)

    def packed(*args, **kwargs):
        calls.append("packed" if kwargs.get("segments") is not None else "unpacked")
        return packed_sdpa(*args, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "flash_attention_2", flash)
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, PACKED_SDPA, packed)
    for role in ("guider", "ar", "drafter"):
        calls.clear()
        model = load_model(tiny_zoo[role], device="cuda").model
        items = [Item(DynamicCache(), [5, 9, 11], [0, 1, 2], 3), Item(DynamicCache(), [7, 3], [0, 1], 2)]
        forward(model, items)
        assert calls and set(calls) == {"packed"}, (role, calls)
