"""Model FLOP utilisation: the model FLOPs a level ran per second (services/cli/breakdown.py) over what torch's
matmul reaches on this machine, measured in the same run on the busiest model's own shapes: its decoder tokens per
batched call times its hidden size, by its MLP's intermediate size ([T, H] x [H, I]).

In process the reference runs on the thread the forwards ran on, with its torch threads (OpenMP team): run on a
thread of its own, it led a second team beside the forwards', and with more OpenMP threads than cores libgomp stops
spinning at its barriers: the reference read 145-156 GFLOP/s there against 298-310 on the forwards' thread at c=1's
shape, 330-358 against 407-436 at c=16's, and the MFU twice and a quarter too high."""

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from services.cli.breakdown import work_of
from services.cli.load import LoadRow
from services.common.checkpoints import read_config
from services.common.config import EngineConfig
from services.common.threads import DEFAULT_THREADS, intra_op_threads
from services.orchestrator.engine.round_timing import RoundTiming


def model_shape(config: EngineConfig, host: str) -> tuple[int, int]:
    """(hidden, intermediate) of the model a host ran (drafter_ar runs the drafter), from its config.json."""
    cfg = read_config(config.path("drafter" if host == "drafter_ar" else host))
    return cfg["hidden_size"], cfg["intermediate_size"]


def matmul_flops_per_s(
    tokens: int,
    hidden: int,
    intermediate: int,
    device: str = "cpu",
    dtype: str = "float32",
    seconds: float = 1.0,
    least: int = 20,
) -> float:
    """Best of repeated [tokens, hidden] x [hidden, intermediate] matmuls on the models' device and dtype, at least
    `least` runs of ten and for about `seconds`, on the calling thread's torch threads: best of, since the threads of
    the forwards just run may still spin for a while (OpenMP's block time), and a shared machine's other work comes
    and goes."""
    import torch

    a = torch.randn(tokens, hidden, device=device, dtype=getattr(torch, dtype))
    b = torch.randn(hidden, intermediate, device=device, dtype=getattr(torch, dtype))
    sync = torch.cuda.synchronize if a.is_cuda else lambda: None  # a CUDA matmul returns before it runs
    for _ in range(3):
        a @ b
    best, runs, end = float("inf"), 0, time.perf_counter() + seconds
    while runs < least or time.perf_counter() < end:
        runs += 1
        sync()
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        sync()
        best = min(best, (time.perf_counter() - start) / 10)
    return 2 * tokens * hidden * intermediate / best


def measure(row: LoadRow, steps: list[RoundTiming], config: EngineConfig, run: Callable | None = None) -> None:
    """The level's model FLOP/s, the matmul reference on its busiest model's shapes, and their ratio, into the row.
    run(fn, *args): fn(*args) where the forwards ran (in process, LocalExecutor.call_on_worker); None: a server's
    replicas ran them, and the reference runs here on a thread of its own with the config's threads."""
    done = work_of(steps)
    host = done.busiest()
    if host is None:
        return
    hidden, intermediate = model_shape(config, host)
    tokens = done.tokens_per_call(host)
    row.model_gflops_per_s = sum(done.flops.values()) / row.wall_s / 1e9
    run = run or (lambda fn, *args: on_threads(config.threads or DEFAULT_THREADS, fn, *args))
    reference = run(matmul_flops_per_s, tokens, hidden, intermediate, config.device, config.dtype)
    row.matmul_gflops_per_s = reference / 1e9
    row.mfu = row.model_gflops_per_s / row.matmul_gflops_per_s
    row.matmul_shape = f"[{tokens}, {hidden}] x [{hidden}, {intermediate}]"


def on_threads(threads: int, fn, *args):
    """fn(*args) on a thread of its own with `threads` torch threads, leaving the caller's as they were."""
    import torch

    before = torch.get_num_threads()

    def run():
        intra_op_threads(threads)
        try:
            return fn(*args)
        finally:
            torch.set_num_threads(before)  # the default of threads that start later, as it was

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()
