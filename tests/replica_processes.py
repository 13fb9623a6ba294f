"""Serve replica processes by deployment, found in /proc: Ray titles them `ray::ServeReplica:<app>:<deployment>`, with
`.<method>` appended while a call runs on them; or asked of the Ray cluster this process is connected to."""

import os


def replica_pids(deployment: str, marker: str | None = None, app: str = "dlm") -> list[int]:
    """marker: only processes whose environment holds it (another cluster may run on the machine)."""
    title = f"ServeReplica:{app}:{deployment}"
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                name = f.read().split(b"\0")[0].decode(errors="replace")
            if not (name.endswith(title) or f"{title}." in name):
                continue
            if marker is not None:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker.encode() not in f.read():
                        continue
        except OSError:
            continue
        pids.append(int(entry))
    return pids


def cluster_replica_actors(deployment: str, app: str = "dlm") -> list:
    """The actors of the app's replicas of a deployment, in the Ray cluster this process is connected to."""
    import ray

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]
    actors = []
    for name in names:
        try:
            actors.append(ray.get_actor(name, namespace="serve"))
        except ValueError:  # a replica that died meanwhile
            continue
    return actors


def cluster_replica_pids(deployment: str, app: str = "dlm") -> list[int]:
    """The PIDs of the app's live replicas of a deployment, from the Ray cluster this process is connected to (not
    by title: other clusters may run on the machine)."""
    import ray

    pids = []
    for actor in cluster_replica_actors(deployment, app):
        try:
            pids.append(ray.get(actor.__ray_call__.remote(lambda _: os.getpid()), timeout=30))
        except ray.exceptions.RayError:  # a replica that died meanwhile
            continue
    return pids


def forward_threads(deployment: str, app: str = "dlm") -> set[int]:
    """Torch's intra-op threads of the forwards of the deployment's replicas (the router spreads 8 asks over them)."""
    from ray import serve

    handle = serve.get_deployment_handle(deployment, app_name=app)
    return {handle.threads.remote().result(timeout_s=30) for _ in range(8)}


def serving_connection(pids: list[int], port: int) -> int | None:
    """Of these orchestrator processes, the one holding a client connection on the shared gRPC port (a client
    process's channels share one connection, so its streams are all on that orchestrator); None: none holds one."""
    import psutil

    held = [pid for pid in pids if any(c.laddr.port == port and c.raddr for c in psutil.Process(pid).net_connections())]
    return held[0] if held else None
