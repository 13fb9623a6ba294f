"""Scripted test models: language models whose output distributions the test writes, position by position.

A script maps a generation position to log-probabilities [V]. Every output of a forward is the script's row for
the position that output predicts, under the engine's conventions:
  causal drafter         a mask predicts its own position, a clean token the next one (services/dlm_drafter/causal.py)
  bidirectional drafter  every output predicts its own position (logits_shift 0, bidirectional.py)
  AR model / guider      every output predicts the next position (services/ar_guider/guider.py)
Positions the script does not name get a uniform row. The model appends dummy K/V to the DynamicCache it is given,
one entry per input token holding that token's position id, so the engine's cache lengths and truncations work as on
a real model and a test reads which positions a cache holds.
"""

from collections.abc import Mapping
from types import SimpleNamespace

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPast

from services.common.config import EngineConfig
from services.common.contract import FILTER_MODELS
from services.common.models import LoadedModel, ModelMeta
from services.common.packed_attention import Segment, extend
from services.filter.host import FilterHost
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.local_executor import LocalExecutor

VOCAB, EOS, MASK = 32, 0, 1  # token ids 2 .. VOCAB - 1 are plain tokens
MAX_FORWARDS = 200  # a decode that does not end fails its test instead of hanging it


def row(masses: Mapping[int, float], vocab: int = VOCAB, mask_id: int = MASK) -> torch.Tensor:
    """Log-probabilities [V]: the given token -> probability masses, the rest spread evenly over every other token
    but the mask. row({}) is uniform (high entropy); row({7: 0.99}) is a confident 7."""
    probs = torch.zeros(vocab)
    others = torch.ones(vocab, dtype=torch.bool)
    others[mask_id] = False
    for token, p in masses.items():
        probs[token], others[token] = p, False
    probs[others] = (1 - sum(masses.values())) / int(others.sum())
    return probs.log()


def confident(tokens: list[int], p: float = 0.99) -> dict[int, torch.Tensor]:
    """A script where generation position i is tokens[i] at probability p."""
    return {i: row({t: p}) for i, t in enumerate(tokens)}


class ScriptedLM(nn.Module):
    """Drop-in for a transformers causal LM as the engine calls it: base_model(input_ids or inputs_embeds,
    position_ids, a DynamicCache, use_cache) -> last hidden states, which are the scripted logits, and an identity
    vocabulary head; .config, .device, .dtype, get_input_embeddings()."""

    def __init__(
        self,
        script: Mapping[int, torch.Tensor],
        prompt_len: int,
        bidirectional: bool = False,
        next_script: Mapping[int, torch.Tensor] | None = None,
    ):
        """next_script, where given: what a causal drafter's clean tokens predict of the next position (its
        next-token head), where it differs from what a mask there predicts (script)."""
        super().__init__()
        self.prompt_len, self.bidirectional = prompt_len, bidirectional
        self.table = table_of(script)
        self.next_table = table_of(next_script) if next_script is not None else None
        # one-hot embeddings: inputs_embeds.argmax(-1) gives the ids back, also under iteration smoothing's mix-in
        self.embed = nn.Embedding(VOCAB, VOCAB, _weight=torch.eye(VOCAB))
        self.embed.weight.requires_grad_(False)
        self.config = SimpleNamespace(
            num_hidden_layers=1,
            num_key_value_heads=1,
            num_attention_heads=1,
            head_dim=1,
            hidden_size=VOCAB,
            vocab_size=VOCAB,
            is_causal=not bidirectional,
        )
        self.inputs: list[int] = []  # tokens through the model, per forward
        self.calls: list[tuple[torch.Tensor, list[Segment] | None]] = []  # (input ids, segments) per forward
        self.positions: list[tuple[list[int], list[int]]] = []  # (input positions, positions in the cache) per forward
        self.pasts: list[list[int]] = []  # the cache's tokens before each forward

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    @property
    def base_model(self) -> "ScriptedLM":
        """The decoder whose last hidden states are the scripted logits (hidden size = vocabulary)."""
        return self

    def get_output_embeddings(self) -> nn.Module:
        return nn.Identity()

    def forward(
        self,
        input_ids=None,
        inputs_embeds=None,
        position_ids=None,
        past_key_values=None,
        use_cache=True,
        segments=None,
        **_,
    ):
        ids = input_ids if input_ids is not None else inputs_embeds.argmax(-1)  # [B, Q]
        self.inputs.append(ids.shape[-1])
        self.calls.append((ids, segments))
        assert len(self.inputs) <= MAX_FORWARDS, "the decode does not end"
        caches = [seg.cache for seg in segments] if segments is not None else [past_key_values]
        self.positions.append((position_ids.flatten().tolist(), [p for c in caches for p in cached_positions(c)]))
        keys = ids.to(self.dtype)[:, None, :, None]  # [B, heads, Q, head_dim]: the dummy K are the token ids
        values = position_ids.to(self.dtype)[:, None, :, None]  # and the dummy V their position ids
        if segments is not None:  # a packed forward: what packed_sdpa does in each attention layer
            self.pasts.append([t for c in caches for t in cached_tokens(c)])
            for layer in range(self.config.num_hidden_layers):
                for seg in segments:
                    extend(seg, layer, keys[:, :, seg.new], values[:, :, seg.new])
        elif past_key_values is not None:
            self.pasts.append(cached_tokens(past_key_values))
            for layer in range(self.config.num_hidden_layers):
                past_key_values.update(keys, values, layer)
        target = position_ids - self.prompt_len  # [B, Q] generation position of each input
        if not self.bidirectional:
            target = target + (ids != MASK).long()
        unscripted = len(self.table) - 1
        target = torch.where((target >= 0) & (target < unscripted), target, unscripted)
        logits = self.table[target]
        if self.next_table is not None and not self.bidirectional:
            clean = (ids != MASK)[..., None]
            logits = torch.where(clean, self.next_table[target.clamp(max=len(self.next_table) - 1)], logits)
        return BaseModelOutputWithPast(last_hidden_state=logits, past_key_values=past_key_values)


def table_of(script: Mapping[int, torch.Tensor]) -> torch.Tensor:
    """[positions + 1, V] log-probabilities; the last row, uniform, for positions the script does not name."""
    size = max(script, default=-1) + 1
    table = torch.full((size + 1, VOCAB), -torch.log(torch.tensor(float(VOCAB))))
    for position, logprobs in script.items():
        table[position] = logprobs
    return table


def cached_tokens(cache) -> list[int]:
    """The token ids a ScriptedLM wrote into a cache, in physical order."""
    return cache.layers[0].keys.flatten().long().tolist() if cache.get_seq_length() else []


def cached_positions(cache) -> list[int]:
    """The position ids a ScriptedLM wrote into a cache, in physical order."""
    if cache is None or cache.get_seq_length() == 0:
        return []
    return cache.layers[0].values.flatten().long().tolist()


class ScriptedTokenizer:
    """What the engine asks of a tokenizer: its size, the special ids, decoding."""

    chat_template = None
    eos_token_id, mask_token_id = EOS, MASK

    def __len__(self) -> int:
        return VOCAB

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i in (EOS, MASK)))


ROLES_BIDIRECTIONAL = {"drafter_bidirectional"}


def scripted_engine(models: dict[str, ScriptedLM], max_new_tokens: int, filters: dict | None = None) -> Engine:
    """An in-process engine whose executor holds the scripted models by role (drafter, drafter_bidirectional,
    guider, ar) and, when given, filters by drafter family (anything with the Learn2PD filter's accept_probs_batch
    and config)."""
    filters = filters or {}
    roles = [*models, *(FILTER_MODELS[family] for family in filters)]
    config = EngineConfig(models={role: f"scripted/{role}" for role in roles}, max_new_tokens=max_new_tokens)
    pool = LocalExecutor(config)
    for role, model in models.items():
        meta = ModelMeta(f"scripted/{role}", ScriptedTokenizer(), MASK, EOS, 512, role in ROLES_BIDIRECTIONAL)
        pool.loaded[role] = LoadedModel(model, meta)
    if filters:
        pool.hosts["filter"] = FilterHost(filters)
    return Engine(config, pool)
