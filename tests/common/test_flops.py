"""The FLOPs a packed forward counts equal a hand count from the tiny model's shapes."""

import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from services.common import flops
from services.common.batch import Item, forward
from services.common.lean_load import lean_model
from services.common.lean_model import LeanModel
from tests.tiny import qwen3_kwargs

# tests/tiny.py's Qwen3: hidden 64, MLP 128, 2 layers, 4 query heads and 2 KV heads of 16, vocabulary 300
H, MLP, LAYERS, HEADS, KV_HEADS, HEAD_DIM, V = 64, 128, 2, 4, 2, 16, 300


def tiny() -> LeanModel:
    torch.manual_seed(0)
    return lean_model(Qwen3ForCausalLM(Qwen3Config(**qwen3_kwargs(V))).eval())


def hand_count(new: list[int], past: list[int], head_rows: int) -> int:
    """The last layer's output projection and MLP run on the rows read only (head_rows)."""
    tail = HEADS * HEAD_DIM * H + 3 * H * MLP  # o, MLP
    per_layer = H * HEADS * HEAD_DIM + 2 * H * KV_HEADS * HEAD_DIM + tail  # q, k, v, then the tail
    linear = 2 * LAYERS * per_layer * sum(new) - 2 * tail * (sum(new) - head_rows)
    attention = 2 * 2 * LAYERS * HEADS * HEAD_DIM * sum(q * (p + q) for q, p in zip(new, past, strict=True))
    return linear + attention + 2 * H * V * head_rows


def item(model, cached: int, new: int, wanted: slice | None = None) -> Item:
    cache = DynamicCache()
    if cached:
        forward(model, [Item(cache, list(range(3, 3 + cached)), list(range(cached)), cached)])
    return Item(cache, list(range(10, 10 + new)), list(range(cached, cached + new)), new, wanted=wanted)


def counted(model, items: list[Item]) -> tuple[int, int]:
    before, tokens = flops.counted(), flops.decoder_tokens()
    forward(model, items)
    return flops.counted() - before, flops.decoder_tokens() - tokens


def test_a_packed_forward_counts_the_hand_count():
    model = tiny()
    items = [item(model, 5, 3), item(model, 0, 4, wanted=slice(1, 3)), item(model, 2, 6)]
    assert counted(model, items) == (hand_count([3, 4, 6], [5, 0, 2], 3 + 2 + 6), 13)


def test_a_single_forward_counts_the_hand_count():
    model = tiny()
    assert counted(model, [item(model, 7, 4, wanted=slice(3, 4))]) == (hand_count([4], [7], 1), 4)
