"""Torch's intra-op threads where the forwards run: the in-process executor's worker thread, a model replica's channel
thread."""

import torch

DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice, one per core, before any engine changed it


def intra_op_threads(n: int) -> None:
    """Torch's intra-op threads for the calling thread, and for threads that run torch later.

    With OpenMP, each thread that runs a parallel op leads a team of its own. The forwards run on the worker with
    `threads`; the stages' ops run on the event loop's thread, and one elementwise op there over a vocabulary row
    starts a second team. With more OpenMP threads than cores libgomp stops spinning between parallel regions, and
    every later forward ran at half speed (drafter 6.6 -> 12.6 ms, guider 3.0 -> 6.2 ms, once an `ar` request ran).
    """
    torch.get_num_threads()  # this thread's first use of the pool reads the default; let it happen before the set
    torch.set_num_threads(n)
