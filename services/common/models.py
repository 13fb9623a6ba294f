"""Load transformers causal LMs from local directories: drafters, guiders and AR baselines alike."""

import os
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from services.common import checkpoints
from services.common.batch import Decoder
from services.common.lean_load import lean_model

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(slots=True)
class ModelMeta:
    """What the orchestrator needs of a model without its weights: tokenizer, special ids, context length."""

    path: str
    tokenizer: object
    mask_id: int | None
    eos_id: int
    max_length: int
    bidirectional: bool
    logits_shift: int = 0  # 1: the output at position i-1 predicts token i (Dream); 0: the drafters' convention


@dataclass(slots=True)
class LoadedModel:
    model: PreTrainedModel  # transformers' modules: training-side evaluation, tests
    meta: ModelMeta
    decoder: Decoder  # what the hosts' forwards run (batch.py): the lean decoder over the model's weights

    @property
    def device(self) -> torch.device:
        return self.decoder.device

    @property
    def path(self) -> str:
        return self.meta.path

    @property
    def tokenizer(self):
        return self.meta.tokenizer

    @property
    def mask_id(self) -> int | None:
        return self.meta.mask_id

    @property
    def eos_id(self) -> int:
        return self.meta.eos_id

    @property
    def max_length(self) -> int:
        return self.meta.max_length

    @property
    def bidirectional(self) -> bool:
        return self.meta.bidirectional


def load_meta(path: str) -> ModelMeta:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model directory not found: {path}")
    family, config = checkpoints.load_config(path)  # native, or a foreign layout mapped onto a native config
    tokenizer = checkpoints.load_tokenizer(path, family)
    bidirectional = getattr(config, "dlm_family", None) == "bidirectional" or not getattr(config, "is_causal", True)
    mask_id = getattr(config, "mask_token_id", None)
    if mask_id is None:
        mask_id = tokenizer.mask_token_id
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    max_length = int(getattr(config, "max_position_embeddings", 4096))
    shift = checkpoints.logits_shift(config)
    return ModelMeta(path, tokenizer, mask_id, int(eos_id), max_length, bidirectional, shift)


def load_model(path: str, device: str = "cpu", dtype: str = "float32", cpu_kernels: bool = True) -> LoadedModel:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    meta = load_meta(path)
    model = checkpoints.load_causal_lm(path, DTYPES[dtype], "sdpa")
    if meta.bidirectional:
        make_bidirectional(model)
    model.to(device).eval()
    return LoadedModel(model, meta, lean_model(model, cpu_kernels))


def make_bidirectional(model: PreTrainedModel) -> None:
    # transformers builds a bidirectional mask when config.is_causal is False; SDPA reads module.is_causal.
    model.config.is_causal = False
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False
