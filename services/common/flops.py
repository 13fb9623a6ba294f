"""Model FLOPs of the forwards actually run (services/common/batch.py counts each forward here), for MFU:
2 x the linear weights x the tokens through them, plus attention's scores and weighted sum over the keys each query
sees, plus the vocabulary head over the rows it runs on. Embedding lookups, norms and activations are not counted.

The count is kept per thread: a host call runs on one thread (the executor's or the replica's host thread), so the
difference of `counted()` (and `decoder_tokens()`) around a call is that call's (services/common/compute.py)."""

import threading

_thread = threading.local()


def forward_flops(linear: int, width: int, head: int, tokens: int, attended: int, rows: int) -> int:
    """linear: weights of the decoder's linear layers (attention projections and MLP); width: layers x query heads x
    head_dim; head: weights of the vocabulary head. tokens: new tokens through the decoder; attended: query-key pairs
    attention computes, summed over requests (each request's q_i new tokens against its L_i + q_i keys); rows: rows
    the vocabulary head runs on."""
    return 2 * linear * tokens + 4 * width * attended + 2 * head * rows  # attention: QK^T and AV


def add(flops: int, tokens: int) -> None:
    _thread.flops, _thread.tokens = counted() + flops, decoder_tokens() + tokens


def counted() -> int:
    """FLOPs this thread's forwards have run so far."""
    return getattr(_thread, "flops", 0)


def decoder_tokens() -> int:
    """Tokens this thread's forwards have run through a decoder so far."""
    return getattr(_thread, "tokens", 0)
