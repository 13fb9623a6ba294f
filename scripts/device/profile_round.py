"""Where an in-process `pipeline` step goes on the config's device: torch.profiler over batches of c=1 and c=16
requests (48 new tokens each), per step the host's op time, the device's kernel time, the kernel launches and the
copies and syncs with the host, then the ops' tables. `python profile_round.py CONFIG` (scripts/device/variants.sh
runs it on a lent GPU)."""

import sys
import time
from concurrent.futures import Executor, Future

import torch
from torch.profiler import ProfilerActivity, profile

from services.common.config import EngineConfig
from services.common.params import BENCH_PROMPTS
from services.common.sampling import SamplingParams
from services.orchestrator.engine.engine import Engine

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel")


class Inline(Executor):
    """The hosts' calls on the calling thread: the profiler records the thread it starts on, not the step's worker."""

    def submit(self, fn, *args, **kwargs) -> Future:
        future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def steps(engine: Engine, concurrency: int, requests: int) -> int:
    """Decode `requests` prompts, `concurrency` at a time; -> the steps it took."""
    count = 0
    for first in range(0, requests, concurrency):
        for i in range(first, min(first + concurrency, requests)):
            engine.add_request(BENCH_PROMPTS[i % len(BENCH_PROMPTS)], "pipeline", {}, 48, SamplingParams())
        while engine.has_unfinished():
            engine.step()
            count += 1
    return count


def main(config_path: str) -> None:
    engine = Engine(EngineConfig.from_yaml(config_path))
    engine.executor.worker = Inline()
    cuda = engine.config.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    steps(engine, 1, 4)  # warm up
    steps(engine, 16, 16)
    for concurrency, requests in ((1, 12), (16, 32)):
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            n = steps(engine, concurrency, requests)
            if cuda:
                torch.cuda.synchronize()
            wall_ms = 1000 * (time.perf_counter() - start)
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
        print(ops.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=48))
        if cuda:
            print(ops.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=48))


if __name__ == "__main__":
    main(sys.argv[1])
