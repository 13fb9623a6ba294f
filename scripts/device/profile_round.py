"""Where an in-process `pipeline` step goes on the config's device: torch.profiler over c=1 and c=16 (48 new tokens a
request, kept in flight as `dlm bench --concurrency` keeps them), per step the host's op time, the device's kernel time,
the kernel launches and the copies and syncs with the host, then the ops' tables. `python profile_round.py CONFIG`
(scripts/device/variants.sh runs it on a lent GPU).

Then each level's floor: every linear and attention call its forwards made, replayed alone at its own shapes (best
of several runs), against the level's unprofiled wall time, and the model FLOP/s (services/common/flops.py) at each:
what the step would cost, and reach, if it were nothing but its matmuls and attention kernels. On a CPU also the
same calls timed where they ran, in a third, unprofiled run of the level (its `in place:` line): a kernel in the step
runs slower than replayed back to back, and the gap is part of where the step goes."""

import collections
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from services.cli.mfu import matmul_flops_per_s, model_shape
from services.common import flops
from services.common.config import EngineConfig
from services.common.params import BENCH_PROMPTS
from services.common.sampling import SamplingParams
from services.common.threads import DEFAULT_THREADS, intra_op_threads
from services.orchestrator.engine.engine import Engine

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel")


class Inline(Executor):
    """The hosts' calls on the calling thread: the profiler records the thread it starts on, not the step's worker."""

    def submit(self, fn, *args, **kwargs) -> Future:
        future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def steps(engine: Engine, concurrency: int, requests: int) -> int:
    """Decode `requests` prompts, keeping `concurrency` in flight as `dlm bench --concurrency` does (when one ends,
    the next starts); -> the steps it took."""
    count = added = 0
    while added < requests or engine.has_unfinished():
        while added < requests and len(engine.requests) < concurrency:
            engine.add_request(BENCH_PROMPTS[added % len(BENCH_PROMPTS)], "pipeline", {}, 48, SamplingParams())
            added += 1
        engine.step()
        count += 1
    return count


KERNELS = ("aten::linear", "aten::scaled_dot_product_attention")  # the calls the floor replays


def replay(name: str, shapes: tuple, device: str, dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    """One recorded call, on random inputs of its shapes: F.linear(x, w[, b]), or SDPA(q, k, v[, mask]) with the
    grouped-query heads the hosts ask for where k has fewer heads than q."""
    args = [torch.randn(shape, device=device, dtype=dtype) if shape else None for shape in shapes[:4]]
    if name == "aten::linear":
        return lambda: F.linear(*args[:3])
    q, k, v, mask = args
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def kernel_floor_ms(
    prof: profile, device: str, dtype: torch.dtype, sync: Callable[[], None], runs: int = 20
) -> dict[str, float]:
    """op -> milliseconds its recorded calls take replayed alone, each shape's best of `runs` times its count."""
    calls = collections.Counter(
        (e.name, tuple(map(tuple, e.input_shapes))) for e in prof.events() if e.name in KERNELS
    )  # (op, each input's shape, () where it is not a tensor) -> calls
    floor: dict[str, float] = collections.defaultdict(float)
    for (name, shapes), count in calls.items():
        call = replay(name, shapes, device, dtype)
        best = float("inf")
        for _ in range(runs + 3):  # the first three warm the shape up
            sync()
            start = time.perf_counter()
            call()
            sync()
            best = min(best, time.perf_counter() - start)
        floor[name] += 1000 * best * count
    return floor


@contextlib.contextmanager
def timed_kernels() -> Iterator[tuple[dict[str, float], list[tuple[int, int, int]]]]:
    """While open, every F.linear and SDPA call in the process is timed where it runs: -> (op -> milliseconds, each
    linear's (rows, out, in)). The forwards look both up in torch.nn.functional at each call, so they meet these."""
    spent: dict[str, float] = collections.defaultdict(float)
    linears: list[tuple[int, int, int]] = []
    originals = {name: getattr(F, name) for name in ("linear", "scaled_dot_product_attention")}

    def timed(name: str, call: Callable) -> Callable:
        def run(*args, **kwargs):
            if name == "linear":
                linears.append((args[0].shape[0], *args[1].shape))
            start = time.perf_counter()
            out = call(*args, **kwargs)
            spent[f"aten::{name}"] += 1000 * (time.perf_counter() - start)
            return out

        return run

    for name, call in originals.items():
        setattr(F, name, timed(name, call))
    try:
        yield spent, linears
    finally:
        for name, call in originals.items():
            setattr(F, name, call)


def in_place(engine: Engine, concurrency: int, requests: int) -> str:
    """The level run again, its kernels timed where they ran, against the MFU reference on the drafter's shapes
    (services/cli/mfu.py: its MLP's [tokens per call, H] x [H, I], here on this thread, where the forwards ran)."""
    before = flops.counted()
    with timed_kernels() as (spent, linears):
        start = time.perf_counter()
        n = steps(engine, concurrency, requests)
        step_ms = 1000 * (time.perf_counter() - start) / n
    model_per_step = (flops.counted() - before) / n
    linear, attention = (spent[name] / n for name in KERNELS)
    hidden, intermediate = model_shape(engine.config, "drafter")
    rows = [m for m, out, width in linears if (out, width) == (2 * intermediate, hidden)]  # the drafter's gate_up
    tokens = round(sum(rows) / len(rows))
    reference = matmul_flops_per_s(tokens, hidden, intermediate, engine.config.device, engine.config.dtype) / 1e9
    model = model_per_step / (linear + attention) / 1e6
    return (
        f"in place: the linears {linear:.2f} ms per step, attention {attention:.2f}: {linear + attention:.2f} of "
        f"{step_ms:.2f} ms ({(linear + attention) / step_ms:.0%}); model at that {model:.1f} GFLOP/s, "
        f"{model / reference:.0%} of matmul [{tokens}, {hidden}] x [{hidden}, {intermediate}] {reference:.1f} GFLOP/s "
        f"(the step: {model_per_step / step_ms / 1e6 / reference:.0%})"
    )


def level(engine: Engine, concurrency: int, requests: int, activities: list, sync: Callable[[], None]):
    """The level run unprofiled (its wall time and model FLOPs), then again profiled with the calls' shapes."""
    before = flops.counted()
    start = time.perf_counter()
    n = steps(engine, concurrency, requests)
    sync()
    wall_ms, model = 1000 * (time.perf_counter() - start), flops.counted() - before
    with profile(activities=activities, record_shapes=True) as prof:
        steps(engine, concurrency, requests)
        sync()
    return n, wall_ms, model, prof


def main(config_path: str) -> None:
    # torch's ops: the calls the profiler records and the floor replays (the CPU kernels are no aten ops; on a GPU
    # the decoder runs torch's anyway)
    engine = Engine(EngineConfig.from_yaml(config_path, cpu_kernels=False))
    engine.executor.worker = Inline()
    intra_op_threads(engine.config.threads or DEFAULT_THREADS)  # the forwards now run here, as on the worker
    cuda = engine.config.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync = torch.cuda.synchronize if cuda else lambda: None
    dtype = getattr(torch, engine.config.dtype)
    steps(engine, 1, 4)  # warm up
    steps(engine, 16, 16)
    for concurrency, requests in ((1, 12), (16, 128)):  # the bench's 8 requests a stream at c=16
        n, wall_ms, model, prof = level(engine, concurrency, requests, activities, sync)
        ops = prof.key_averages()
        host_ms = sum(e.self_cpu_time_total for e in ops) / 1000
        device_ms = sum(e.self_device_time_total for e in ops) / 1000
        launches = sum(e.count for e in ops if e.key in LAUNCHES)
        syncs = sum(e.count for e in ops if "Synchronize" in e.key or e.key == "cudaMemcpyAsync")
        print(
            f"\n== c={concurrency}: {n} steps in {wall_ms:.1f} ms, {wall_ms / n:.2f} ms per step; per step: "
            f"profiled CPU ops {host_ms / n:.2f} ms, device kernels {device_ms / n:.2f} ms, "
            f"{launches / n:.0f} kernel launches, {syncs / n:.1f} syncs/copies"
        )
        floor = kernel_floor_ms(prof, engine.config.device, dtype, sync)
        alone = sum(floor.values())
        print(
            f"floor: the linears alone {floor['aten::linear'] / n:.2f} ms per step, attention "
            f"{floor['aten::scaled_dot_product_attention'] / n:.2f}: {alone / n:.2f} of {wall_ms / n:.2f} ms "
            f"({alone / wall_ms:.0%}); model {model / wall_ms / 1e6:.1f} GFLOP/s, at the floor "
            f"{model / alone / 1e6:.1f}"
        )
        if not cuda:  # a launch's host time is not its kernel's
            print(in_place(engine, concurrency, requests))
        print(ops.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=48))
        if cuda:
            print(ops.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=48))


if __name__ == "__main__":
    main(sys.argv[1])
