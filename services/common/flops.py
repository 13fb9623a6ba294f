"""Model FLOPs of the forwards actually run (services/common/batch.py counts each packed forward here), for MFU:
2 x the linear weights x the tokens through them, plus attention's scores and weighted sum over the keys each query
sees, plus the vocabulary head over the rows it runs on. Embedding lookups, norms and activations are not counted.

The count is kept per thread: a host call runs on one thread (the executor's or the replica's host thread), so the
difference of `counted()` (and `decoder_tokens()`) around a call is that call's (services/common/compute.py)."""

import threading
from functools import cache

from torch import nn
from transformers import PreTrainedModel

from services.common.kv import head_dim

_thread = threading.local()


@cache
def linear_params(model: PreTrainedModel) -> int:
    """Weights of the decoder's linear layers (attention projections and MLP), not the embeddings or the head."""
    return sum(m.weight.numel() for m in model.base_model.modules() if isinstance(m, nn.Linear))


def forward_flops(model: PreTrainedModel, tokens: int, attended: int, head_rows: int) -> int:
    """tokens: new tokens through the decoder; attended: query-key pairs attention computes, summed over requests
    (each request's q_i new tokens against its L_i + q_i keys); head_rows: rows the vocabulary head runs on."""
    cfg = model.config
    attention = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim(cfg) * attended  # QK^T and AV
    head = 2 * sum(p.numel() for p in model.get_output_embeddings().parameters()) * head_rows
    return 2 * linear_params(model) * tokens + attention + head


def add(flops: int, tokens: int) -> None:
    _thread.flops, _thread.tokens = counted() + flops, decoder_tokens() + tokens


def counted() -> int:
    """FLOPs this thread's forwards have run so far."""
    return getattr(_thread, "flops", 0)


def decoder_tokens() -> int:
    """Tokens this thread's forwards have run through a decoder so far."""
    return getattr(_thread, "tokens", 0)
