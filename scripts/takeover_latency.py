"""What an orchestrator kill costs a stream: the Serve app on the tiny test zoo (a local Ray, its own redis-server),
N seeded streams at temperature 0.8 over pipeline, streaming, slot (kv=recompute) and guided through DlmClient, run
once undisturbed and once with the orchestrator replica SIGKILLed when every stream has its first chunk. Prints,
over the streams, the added latency (disturbed - undisturbed seconds) p50 and max, the takeover time (kill -> the
first chunk after the stream's longest silence) p50 and max, and when gRPC answered SERVING again; every stream must
end with its undisturbed text. REPLICAS orchestrator replicas: with 1, Serve restarts it, and the new one (a new
owner) adopts the requests once the dead one's lease lapsed; with 2, the one that holds the client's connection (and
so every stream: one process's channels share it) is killed, and the live one's sweep adopts them once the lease
lapsed, while the client reconnects to it.
`PYTHONPATH=. python scripts/takeover_latency.py [STREAMS] [LEASE_S] [REPLICAS]`

On a shared 2-core CPU, 8 streams, lease_s 1.0, 1 replica: added latency p50 6.32 s, max 7.54 s; takeover p50
9.69 s, max 9.72 s; gRPC SERVING again 9.32 s after the kill: Serve's restart of the replica (a new Python process
that loads the app) plus under a second of lease, sweep and the client's backoff.
"""

import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.orchestrator.cluster.test_services import served_app
from tests.orchestrator_kill import CASES, figures, killed_streams, run_streams
from tests.replica_processes import cluster_replica_pids, serving_connection
from tests.tiny import zoo

TOKENS = 128


def main(streams: int = 8, lease_s: float = 1.0, replicas: int = 1) -> None:
    cases = (list(CASES.items()) * streams)[:streams]
    work = Path(tempfile.mkdtemp(prefix="takeover-"))
    engine = {"models": zoo(str(work / "zoo")), "max_new_tokens": TOKENS, "chat_template": False}
    engine["serving"] = {"lease_s": lease_s, "replicas": {"orchestrator": replicas}}
    with served_app(engine, work / "dlm.yaml", num_cpus=6) as (client, _):
        calm = run_streams(client, cases, TOKENS, 70)
        back: list[float] = []
        port = int(client.target.rsplit(":", 1)[1])

        def kill() -> None:
            pid = serving_connection(cluster_replica_pids("orchestrator"), port)
            assert pid is not None, "no orchestrator holds the client's connection"
            os.kill(pid, signal.SIGKILL)
            threading.Thread(target=wait_serving, args=(client, time.monotonic(), back), daemon=True).start()

        disturbed, killed = killed_streams(client, cases, TOKENS, 70, kill)
        assert all((d.ids, d.text) == (c.ids, c.text) for d, c in zip(disturbed, calm, strict=True)), "text changed"
        found = figures(calm, disturbed, killed)
        added = f"added latency p50 {found['added_p50']:.2f} s, max {found['added_max']:.2f} s"
        takeover = f"takeover p50 {found['takeover_p50']:.2f} s, max {found['takeover_max']:.2f} s"
        print(
            f"{streams} streams, {replicas} orchestrator replica(s), lease_s {lease_s}: {added}; {takeover}; ", end=""
        )
        print(f"gRPC SERVING again {back[0]:.2f} s after the kill")


def wait_serving(client, since: float, out: list[float]) -> None:
    while True:
        try:
            if client.health() == "SERVING":
                out.append(time.monotonic() - since)
                return
        except Exception:  # not listening yet
            pass
        time.sleep(0.05)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 8, float(args[1]) if len(args) > 1 else 1.0, int(args[2]) if len(args) > 2 else 1)
