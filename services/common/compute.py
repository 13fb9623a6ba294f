"""A batched host call, timed where it runs: in process (orchestrator/engine/local_executor.py) and on a replica
(services/serving/replica.py) alike, so that a round's breakdown (orchestrator/engine/round_timing.py) reads the
same record either way."""

import threading
import time

from services.common import flops
from services.common.contract import Args, Compute, Reply

_thread = threading.local()


def timed_call(host: object, name: str, method: str, args: list[Args]) -> list[Reply]:
    """host.method(args), each reply carrying the call's Compute (one object: the engine counts it once). Run on the
    host's one thread: the end of its previous call is kept here, per thread."""
    before, decoder_tokens = flops.counted(), flops.decoder_tokens()
    start, cpu = time.time(), time.thread_time()
    replies = getattr(host, method)(args)
    end, cpu = time.time(), time.thread_time() - cpu
    free_since, _thread.end = getattr(_thread, "end", 0.0), end
    work = flops.counted() - before, flops.decoder_tokens() - decoder_tokens
    compute = Compute(name, start, end, *work, free_since, cpu)
    for reply in replies:
        reply.compute = compute
    return replies
