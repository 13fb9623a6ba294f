"""Tiny end-to-end setup (data dir, tokenizer, model/train config) for tests and smoke runs: seconds on CPU."""

from __future__ import annotations

from pathlib import Path

from services.training import bpe, dataset
from services.training.train_loop import TrainConfig

TINY_MODEL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=64
)


def setup(root: str | Path, n_train: int = 60) -> tuple[Path, Path]:
    """(data dir, tokenizer dir) under root."""
    root = Path(root)
    data, tok = root / "data", root / "tokenizer"
    dataset.build(dataset.DataConfig(out=str(data), n_train=n_train, n_heldout=8, max_modules=3))
    bpe.train_from_data(bpe.BpeConfig(vocab_size=400, out=str(tok), data=str(data), task_samples=n_train))
    return data, tok


def config(root: str | Path, name: str, **kw) -> TrainConfig:
    root = Path(root)
    base = dict(
        name=name,
        out=str(root / "models" / name),
        run_dir=str(root / "runs" / name),
        data=str(root / "data"),
        tokenizer=str(root / "tokenizer"),
        model=dict(TINY_MODEL),
        steps=30,
        batch_tokens=1024,
        max_len=160,
        lr=3e-3,
        warmup=5,
        eval_every=15,
        ckpt_every=15,
        eval_batches=2,
        corpus_frac=0.1,
        threads=1,
    )
    base.update(kw)
    return TrainConfig(**base)
