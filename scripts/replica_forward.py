"""The drafter's propose where it runs: in process, on its Serve replica (services/serving/replica.py) on the worker
thread Serve gives a sync method (how `run` ran before) and on the replica's host thread (how it runs). The same call
each time (a 15-token prompt and a 16-position window, prefill included), alternating, with one torch thread as a
replica has (serving.replica_threads), and in process with torch's default (one per core) as `dlm bench` runs;
milliseconds measured around the host method where it runs, median.
`PYTHONPATH=. python scripts/replica_forward.py [CALLS]`

Two runs on a shared 2-core CPU (100 and 200 calls), ms and ratio to in process:
in process 9.97 / 10.98; Serve's thread 11.75 (1.18x) / 12.12 (1.10x); host thread 10.60 (1.06x) / 10.77 (0.98x).
The forward itself costs on a replica what it costs in process once it runs on one thread of its own; the 26.6 ms of
the issue's trace are hops and queueing around it, not the forward."""

import asyncio
import statistics
import sys
import time
from dataclasses import asdict

from services.serving.ray_env import set_ray_env

set_ray_env()

import ray  # noqa: E402  after the environment Ray's modules read
import torch  # noqa: E402
from ray import serve  # noqa: E402

from services.common.config import DEFAULT_CONFIG, EngineConfig  # noqa: E402
from services.common.contract import Propose  # noqa: E402
from services.common.models import load_model  # noqa: E402
from services.common.proposal import Region  # noqa: E402
from services.common.request import Request  # noqa: E402
from services.dlm_drafter.deployment import DrafterDeployment  # noqa: E402
from services.dlm_drafter.host import DrafterHost  # noqa: E402
from services.orchestrator.cluster.app import REPLICA_ENV  # noqa: E402


def timed_propose(host: DrafterHost, request_id: str) -> float:
    meta = host.causal.loaded.meta
    call = Propose(Request(request_id, list(range(5, 20)), 48, meta.mask_id, meta.eos_id), Region(0, 16))
    start = time.perf_counter()
    host.propose([call])
    elapsed = time.perf_counter() - start
    host.kv.free(request_id)
    return elapsed


class Timed(DrafterDeployment.func_or_class):
    async def on_host_thread(self, request_id: str) -> float:
        return await asyncio.get_running_loop().run_in_executor(self.worker, timed_propose, self, request_id)

    def on_serve_thread(self, request_id: str) -> float:
        return timed_propose(self, request_id)


async def measure(calls: int) -> dict[str, list[float]]:
    config = EngineConfig.from_yaml(DEFAULT_CONFIG)
    config.models = {"drafter": config.models["drafter"]}
    actor = {"num_cpus": 0, "runtime_env": {"env_vars": REPLICA_ENV}}  # as build_app places a replica
    options = {"ray_actor_options": actor, "logging_config": {"log_level": "WARNING"}}
    handle = serve.run(serve.deployment(Timed).options(name="drafter", **options).bind(asdict(config)), name="f")
    local = DrafterHost(load_model(config.models["drafter"]), None)
    cores, one = torch.get_num_threads(), config.serving.replica_threads
    times: dict[str, list[float]] = {
        "in process": [],
        "replica, Serve's thread": [],
        "replica, host thread": [],
        f"in process, {cores} threads": [],
    }
    for i in range(calls):
        torch.set_num_threads(one)
        times["in process"].append(timed_propose(local, f"l{i}"))
        times["replica, Serve's thread"].append(await handle.on_serve_thread.remote(f"s{i}"))
        times["replica, host thread"].append(await handle.on_host_thread.remote(f"h{i}"))
        torch.set_num_threads(cores)
        times[f"in process, {cores} threads"].append(timed_propose(local, f"c{i}"))
    return times


def main() -> None:
    ray.init(num_cpus=2, logging_level="WARNING", include_dashboard=False)
    try:
        times = asyncio.run(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
    finally:
        ray.shutdown()
    base = statistics.median(times["in process"])
    for name, values in times.items():
        print(f"{name:24} {1000 * statistics.median(values):6.2f} ms  {statistics.median(values) / base:5.2f}x")


if __name__ == "__main__":
    main()
