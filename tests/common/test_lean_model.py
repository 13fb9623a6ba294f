"""The lean decoder equals transformers' own forward of the model it was read from: logits within 1e-5 in fp32 and the
same KV in each request's cache, uncached and over caches, causal and bidirectional, with groups masks, rest, input
embeddings and logical (out-of-order) positions, for each family it runs (Qwen3's q/k norm, Qwen2's q/k/v biases,
Llama's output bias), on torch's ops and on the fused CPU kernels (cpu_kernels.py). The norms' weights are random,
so that dropping any of them shows."""

import dataclasses
import inspect

import pytest
import torch
from transformers import (
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from services.common.batch import Item, forward
from services.common.kv import cache_len
from services.common.lean_load import lean_model
from services.common.models import make_bidirectional
from tests.tiny import qwen3_kwargs

V = 300
# the cache's keyword in transformers' forward: `cache` from 5.2x, `past_key_values` before (the GPU image's 5.17)
CACHE = "cache" if "cache" in inspect.signature(Qwen3ForCausalLM.forward).parameters else "past_key_values"
FAMILIES = {
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**qwen3_kwargs(V))),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**qwen3_kwargs(V, tie_word_embeddings=False))),
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**qwen3_kwargs(V), attention_bias=True)),
}


def model_of(family: str, causal: bool, seed: int = 0) -> PreTrainedModel:
    torch.manual_seed(seed)
    model = FAMILIES[family]().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(torch.rand_like(p) + 0.5 if "norm" in name else torch.randn_like(p) * 0.1)
    if not causal:
        make_bidirectional(model)
    return model


def request_mask(past: int, n: int, causal: bool, groups: torch.Tensor | None) -> torch.Tensor:
    """What a request's new tokens see, [n, past + n], as batch.segments defines it."""
    new = torch.ones(n, n, dtype=torch.bool)
    if causal:
        new = new.tril()
    if groups is not None:
        new &= (groups[:, None] == groups[None, :]) | (groups[None, :] == -1)
    return torch.cat([torch.ones(n, past, dtype=torch.bool), new], 1)


@torch.no_grad()
def transformers_forward(model, past: tuple[list, list], item: Item, causal: bool) -> tuple[torch.Tensor, DynamicCache]:
    """transformers' cached path for one request: its past (ids, positions) through the model into a cache, then its
    new tokens with their mask -> (logits [q, V], the cache of past + every new token)."""
    cache, (ids, pos) = DynamicCache(), past
    if ids:
        mask = request_mask(0, len(ids), causal, None)[None, None]
        model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos]), attention_mask=mask, **{CACHE: cache})
    n = len(item.input_ids)
    inputs = {"inputs_embeds": item.embeds[None]} if item.embeds is not None else {}
    out = model(
        input_ids=None if inputs else torch.tensor([item.input_ids]),
        position_ids=torch.tensor([item.position_ids]),
        attention_mask=request_mask(len(ids), n, causal, item.groups)[None, None],
        use_cache=True,
        **{CACHE: cache},
        **inputs,
    )
    return out.logits[0], cache


def lean_cache(lean, ids: list[int], pos: list[int]) -> DynamicCache:
    cache = DynamicCache()
    if ids:
        forward(lean, [Item(cache, ids, pos, len(ids))])
    return cache


KERNELS = pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch-ops"])


@KERNELS
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_uncached_forward_equals_transformers(family, causal, cpu_kernels):
    model = model_of(family, causal)
    ids = torch.randint(0, V, (23,)).tolist()
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids])).logits[0]
    item = Item(DynamicCache(), ids, list(range(len(ids))), len(ids))
    torch.testing.assert_close(forward(lean_model(model, cpu_kernels), [item])[0], expected, atol=1e-5, rtol=0)


@KERNELS
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_a_packed_forward_over_caches_equals_transformers_request_by_request(family, causal, cpu_kernels):
    """Three requests in one packed row: one over a cache of out-of-order positions with groups, keep and rest; one
    without a cache, with groups; one over a cache with input embeddings and a wanted slice. Each one's logits and KV
    are those of transformers' cached forward of that request alone."""
    model = model_of(family, causal, seed=1)
    lean = lean_model(model, cpu_kernels)
    torch.manual_seed(2)
    tokens = torch.randint(0, V, (40,)).tolist()
    pasts = [
        (tokens[:6], [0, 1, 2, 5, 3, 4]),  # a commit made out of logical order
        ([], []),
        (tokens[6:15], list(range(9))),
    ]
    groups = torch.tensor([-1, -1, 0, 0, 1, 1, 1])
    embeds = torch.randn(4, model.config.hidden_size)
    items = [
        Item(lean_cache(lean, *pasts[0]), tokens[15:22], [6, 7, 8, 9, 10, 11, 12], 2, groups, rest=DynamicCache()),
        Item(lean_cache(lean, *pasts[1]), tokens[22:27], [0, 1, 2, 3, 4], 5, torch.tensor([-1, 0, 0, 1, 1])),
        Item(lean_cache(lean, *pasts[2]), tokens[27:31], [9, 10, 11, 12], 3, embeds=embeds, wanted=slice(1, 3)),
    ]
    references = [transformers_forward(model, past, item, causal) for past, item in zip(pasts, items, strict=True)]
    got = forward(lean, items)
    for item, out, (logits, cache), (past_ids, _) in zip(items, got, references, pasts, strict=True):
        wanted = logits if item.wanted is None else logits[item.wanted]
        torch.testing.assert_close(out, wanted, atol=1e-5, rtol=0)
        kept = len(past_ids) + item.keep
        assert cache_len(item.cache) == kept
        for mine, theirs in zip(item.cache.layers, cache.layers, strict=True):
            torch.testing.assert_close(mine.keys, theirs.keys[:, :, :kept], atol=1e-5, rtol=0)
            torch.testing.assert_close(mine.values, theirs.values[:, :, :kept], atol=1e-5, rtol=0)
        if item.rest is not None:
            assert cache_len(item.rest) == len(item.input_ids) - item.keep
            torch.testing.assert_close(item.rest.layers[-1].keys, cache.layers[-1].keys[:, :, kept:], atol=1e-5, rtol=0)


def test_bfloat16_logits_are_transformers():
    model = model_of("qwen3", True).to(torch.bfloat16)
    ids = torch.randint(0, V, (17,)).tolist()
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids])).logits[0].float()
    got = forward(lean_model(model), [Item(DynamicCache(), ids, list(range(len(ids))), len(ids))])[0]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


@KERNELS
def test_rows_not_read_skip_the_last_layer_and_the_rows_read_are_bit_for_bit_the_whole_forwards(cpu_kernels):
    """Past the last layer's attention only the wanted rows run (lean_model.decode): their logits are the whole
    forward's, bit for bit, and every new token's KV still reaches the caches."""
    lean = lean_model(model_of("qwen3", True, seed=3), cpu_kernels)
    torch.manual_seed(4)
    tokens = torch.randint(0, V, (30,)).tolist()

    def items(wanted: list[slice | None]) -> list[Item]:
        return [
            Item(lean_cache(lean, tokens[:5], list(range(5))), tokens[5:14], list(range(5, 14)), 9, wanted=wanted[0]),
            Item(DynamicCache(), tokens[14:30], list(range(16)), 16, wanted=wanted[1]),
        ]

    whole, some = items([None, None]), items([slice(6, None), slice(15, 16)])
    recording = RowsPerLinear(lean.ops)
    expected, got = forward(lean, whole), forward(dataclasses.replace(lean, ops=recording), some)
    # per layer qkv, o, gate_up, down; the last layer's o, gate_up and down (and the head) on the 3 + 1 rows read
    assert recording.rows == [25] * 4 * (len(lean.layers) - 1) + [25, 4, 4, 4, 4]
    for full, part, item in zip(expected, got, some, strict=True):
        assert torch.equal(part, full[item.wanted])
    for a, b in zip(whole, some, strict=True):
        for mine, theirs in zip(a.cache.layers, b.cache.layers, strict=True):
            assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


class RowsPerLinear:
    """An Ops that records the rows of each linear it runs."""

    def __init__(self, ops):
        self.ops, self.rows = ops, []

    def __getattr__(self, name: str):
        return getattr(self.ops, name)

    def linear(self, x, weight, bias=None):
        self.rows.append(x.shape[0])
        return self.ops.linear(x, weight, bias)
