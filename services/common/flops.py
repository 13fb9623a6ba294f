"""Model FLOPs of the forwards actually run (services/common/batch.py counts each forward here), for MFU:
2 x the linear weights x the tokens through them (past the last layer's attention, the rows read), plus attention's
scores and weighted sum over the keys each query sees, plus the vocabulary head over the rows it runs on. Embedding
lookups, norms and activations are not counted.

The count is kept per thread: a host call runs on one thread (the executor's or the replica's host thread), so the
difference of `counted()` (and `decoder_tokens()`) around a call is that call's (services/common/compute.py)."""

import threading

_thread = threading.local()


def forward_flops(linear: int, tail: int, width: int, head: int, tokens: int, attended: int, rows: int) -> int:
    """linear: weights of the decoder's linear layers (attention projections and MLP); tail: those of the last
    layer's past its attention (its output projection and MLP), which run on the rows read only (lean_model.decode);
    width: layers x query heads x head_dim; head: weights of the vocabulary head. tokens: new tokens through the
    decoder; attended: query-key pairs attention computes, summed over requests (each request's q_i new tokens against
    its L_i + q_i keys); rows: rows read, which the tail and the vocabulary head run on."""
    return 2 * (linear - tail) * tokens + 2 * tail * rows + 4 * width * attended + 2 * head * rows  # QK^T and AV


def add(flops: int, tokens: int) -> None:
    _thread.flops, _thread.tokens = counted() + flops, decoder_tokens() + tokens


def counted() -> int:
    """FLOPs this thread's forwards have run so far."""
    return getattr(_thread, "flops", 0)


def decoder_tokens() -> int:
    """Tokens this thread's forwards have run through a decoder so far."""
    return getattr(_thread, "tokens", 0)
