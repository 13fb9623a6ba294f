"""Scripted test models: language models whose output distributions the test writes, position by position.

A script maps a generation position to log-probabilities [V]. Every output of a forward is the script's row for
the position that output predicts, under the engine's conventions:
  causal drafter         a mask predicts its own position, a clean token the next one (services/dlm_drafter/causal.py)
  bidirectional drafter  every output predicts its own position (logits_shift 0, bidirectional.py)
  AR model / guider      every output predicts the next position (services/ar_guider/guider.py)
Positions the script does not name get a uniform row. The model appends dummy K/V to each request's DynamicCache,
one entry per input token holding its token id (K) and position id (V), so the engine's cache lengths and
truncations work as on a real model and a test reads which tokens and positions a cache holds.
"""

import itertools
from collections.abc import Iterator, Mapping

import torch

from services.common.config import EngineConfig
from services.common.contract import FILTER_MODELS
from services.common.flops import forward_flops
from services.common.lean_ops import TORCH_OPS
from services.common.models import LoadedModel, ModelMeta
from services.common.packed_attention import Segment, extend
from services.filter.host import FilterHost
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.local_executor import LocalExecutor

VOCAB, EOS, MASK = 32, 0, 1  # token ids 2 .. VOCAB - 1 are plain tokens
MAX_FORWARDS = 200  # a decode that does not end fails its test instead of hanging it


def draw_generators(seed: int) -> Iterator[torch.Generator]:
    """A request's draws as sampling.Rng defines them, written out for reference loops: draw k samples from a
    generator seeded by splitmix64's finaliser over (the finaliser over the seed) xor k."""

    def splitmix(x: int) -> int:
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 % 2**64
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB % 2**64
        return x ^ (x >> 31)

    for k in itertools.count():
        yield torch.Generator().manual_seed(splitmix(splitmix(seed % 2**64) ^ k))


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


class ScriptedLM:
    """Drop-in for the hosts' decoder (services/common/batch.py: Decoder): one-hot input embeddings, a decode whose
    last hidden states are the scripted logits, and an identity vocabulary head."""

    def __init__(
        self,
        script: Mapping[int, torch.Tensor],
        prompt_len: int,
        bidirectional: bool = False,
        next_script: Mapping[int, torch.Tensor] | None = None,
    ):
        """next_script, where given: what a causal drafter's clean tokens predict of the next position (its
        next-token head), where it differs from what a mask there predicts (script)."""
        self.prompt_len, self.bidirectional = prompt_len, bidirectional
        self.causal = not bidirectional
        self.table = table_of(script)
        self.next_table = table_of(next_script) if next_script is not None else None
        # one-hot embeddings: hidden.argmax(-1) gives the ids back, also under iteration smoothing's mix-in
        self.embedding = torch.eye(VOCAB)
        self.layers = 1
        self.ops = TORCH_OPS  # the scripted probabilities read back as torch computes them
        self.inputs: list[int] = []  # tokens through the model, per forward
        self.calls: list[tuple[torch.Tensor, list[Segment]]] = []  # (input ids [1, Q], segments) per forward
        self.positions: list[tuple[list[int], list[int]]] = []  # (input positions, positions in the cache) per forward
        self.pasts: list[list[int]] = []  # the cache's tokens before each forward

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    def decode(
        self, hidden: torch.Tensor, positions: torch.Tensor, segments: list[Segment], rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        ids = hidden.argmax(-1)  # [Q]
        self.inputs.append(len(ids))
        self.calls.append((ids[None], segments))
        assert len(self.inputs) <= MAX_FORWARDS, "the decode does not end"
        caches = [seg.cache for seg in segments]
        self.positions.append((positions.tolist(), [p for c in caches for p in cached_positions(c)]))
        self.pasts.append([t for c in caches for t in cached_tokens(c)])
        keys = ids.float()[None, None, :, None]  # [1, heads, Q, head_dim]: the dummy K are the token ids
        values = positions.float()[None, None, :, None]  # and the dummy V their position ids
        for layer in range(self.layers):  # what packed_attention.attend does in each attention layer
            for seg in segments:
                extend(seg, layer, keys[:, :, seg.new], values[:, :, seg.new])
        target = positions - self.prompt_len  # [Q] generation position of each input
        if not self.bidirectional:
            target = target + (ids != MASK).long()
        unscripted = len(self.table) - 1
        target = torch.where((target >= 0) & (target < unscripted), target, unscripted)
        logits = self.table[target]
        if self.next_table is not None and not self.bidirectional:
            clean = (ids != MASK)[..., None]
            logits = torch.where(clean, self.next_table[target.clamp(max=len(self.next_table) - 1)], logits)
        return logits if rows is None else logits[rows]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.float()

    def flops(self, tokens: int, attended: int, rows: int) -> int:
        return forward_flops(0, 0, 1, 0, tokens, attended, rows)  # one layer of one head of one dimension


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
    return cache.layers[0].values.flatten().long().tolist() if cache.get_seq_length() else []


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
        pool.loaded[role] = LoadedModel(model, meta, model)
    if filters:
        pool.hosts["filter"] = FilterHost(filters)
    return Engine(config, pool)
