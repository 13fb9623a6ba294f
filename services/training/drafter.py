"""Drafter training from ar-base: `hybrid` (drafter-causal, ReFusion 4.3 + optional WeDLM 4.1 samples and
WeDLM 4.2 dual-stream batches, causal attention) or `mdm` (drafter-bidirectional, LLaDA, full attention)."""

from __future__ import annotations

import random
from functools import partial

from transformers import AutoTokenizer

from services.training import corrupt
from services.training.dataset import Example
from services.training.train_loop import Batch, TrainConfig, train


def make_hybrid_batch(
    examples: list[Example],
    rng: random.Random,
    *,
    mask_id: int,
    eos_id: int,
    slot_sizes: list[int],
    mdm_weight: float = 1.0,
    token_reorder_frac: float = 0.0,
    dual_stream_frac: float = 0.0,
    dual_block_size: int = 16,
    eos_pad_max: int = 0,
) -> Batch:
    if rng.random() < dual_stream_frac:
        insts = [corrupt.dual_stream(e, rng, mask_id, eos_id, dual_block_size, eos_pad_max) for e in examples]
        return corrupt.collate(insts, "dual", mdm_weight, pad_id=eos_id)
    insts = [
        corrupt.token_reorder(e, rng, mask_id, eos_id, eos_pad_max)
        if rng.random() < token_reorder_frac
        else corrupt.hybrid(e, rng, mask_id, eos_id, slot_sizes, eos_pad_max)
        for e in examples
    ]
    return corrupt.collate(insts, "hybrid", mdm_weight, pad_id=eos_id)


def make_mdm_batch(
    examples: list[Example], rng: random.Random, *, mask_id: int, eos_id: int, eos_pad_max: int = 0
) -> Batch:
    insts = [corrupt.bidirectional(e, rng, mask_id, eos_id, eos_pad_max) for e in examples]
    return corrupt.collate(insts, "mdm", pad_id=eos_id)


def run(cfg: TrainConfig, resume: bool = False) -> dict:
    tok = AutoTokenizer.from_pretrained(cfg.tokenizer, local_files_only=True)
    ids = dict(mask_id=tok.mask_token_id, eos_id=tok.eos_token_id)
    if cfg.objective == "hybrid":
        make = partial(
            make_hybrid_batch,
            **ids,
            slot_sizes=cfg.slot_sizes,
            mdm_weight=cfg.mdm_weight,
            token_reorder_frac=cfg.token_reorder_frac,
            dual_stream_frac=cfg.dual_stream_frac,
            dual_block_size=cfg.dual_block_size,
            eos_pad_max=cfg.eos_pad_max,
        )
        extra = {"mask_token_id": tok.mask_token_id, "dlm_family": "causal", "is_causal": True}
    elif cfg.objective == "mdm":
        make = partial(make_mdm_batch, **ids, eos_pad_max=cfg.eos_pad_max)
        extra = {"mask_token_id": tok.mask_token_id, "dlm_family": "bidirectional", "is_causal": False}
    else:
        raise ValueError(f"drafter trainer needs objective 'hybrid' or 'mdm', got {cfg.objective!r}")
    return train(cfg, make, resume=resume, **extra)
