"""AR next-token training of a Qwen3ForCausalLM (ar-base, guider). Loss on response + eos for task
items, on every next token for plain text."""

from __future__ import annotations

import random

import torch

from services.training.dataset import Example
from services.training.train_loop import Batch, TrainConfig, train


def make_ar_batch(examples: list[Example], rng: random.Random | None = None, pad_id: int = 0) -> Batch:
    T = max(len(e.ids) for e in examples)
    B = len(examples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.ids)
        ids[i, :n] = torch.tensor(e.ids)
        attn[i, :n] = 1
        # output at position j predicts token j + 1; first target is the first response token
        start = max(e.n_prompt - 1, 0)
        labels[i, start : n - 1] = ids[i, start + 1 : n]
    pos = torch.arange(T).expand(B, T).clone()
    n_lab = int((labels != -100).sum())
    weights = (labels != -100).float() / max(1, n_lab)
    return Batch(ids, pos, attn, labels, weights)


def run(cfg: TrainConfig, resume: bool = False) -> dict:
    if cfg.objective != "ar":
        raise ValueError(f"ar trainer needs objective 'ar', got {cfg.objective!r}")
    return train(cfg, make_ar_batch, resume=resume)
