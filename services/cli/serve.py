"""`dlm serve`: a local Ray cluster, the Serve app deployed from its Serve config, gRPC on HOST:PORT and the
OpenAI-compatible API on HOST:serving.http_port, until SIGINT or SIGTERM; the cache index on serving.redis_url, or on
a redis-server it starts and stops itself. Every port it configures (gRPC, HTTP, Ray's metrics and dashboard) binds
serving.host; on a loopback host Ray's own servers do too."""

import contextlib
import ipaddress
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict

import yaml

# Ray's switch for a cluster of this machine alone: its node address becomes loopback, so Ray binds its servers
# (GCS, raylet, object manager, workers, agents and the metrics exporter) to 127.0.0.1 rather than to every interface.
LOCAL_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve_ray(config_path: str, flags: dict, device: str | None = None, dtype: str | None = None) -> int:
    """flags: serving keys given on the command line; device, dtype: `dlm --device --dtype` (None: keep the
    config's). The resolved config is what every replica loads its model by."""
    from services.common.config import EngineConfig

    config = EngineConfig.from_yaml(config_path, serving=flags, device=device, dtype=dtype)
    with index_redis(config.serving):
        return serve_on_ray(config)


@contextlib.contextmanager
def index_redis(serving) -> Iterator[None]:
    """The cache index's Redis: the configured one, else a redis-server on loopback that lives as long as the
    server (its URL set in serving.redis_url)."""
    if serving.redis_url:
        yield
        return
    from services.serving.redis_process import redis_process

    with redis_process() as redis:
        serving.redis_url = redis.url
        yield


def serve_on_ray(config) -> int:
    serving = config.serving
    with ray_serving(config) as context:
        host, port = serving.host, serving.port
        logs = os.path.join(context.address_info["session_dir"], "logs", "serve")
        print(f"dlm.v1.DlmService serving on {host}:{port}", flush=True)
        print(f"OpenAI-compatible API: base_url http://{host}:{serving.http_port}/v1", flush=True)
        print(f"Ray dashboard: http://{context.dashboard_url} (token: `ray get-auth-token`)", flush=True)
        print(f"Prometheus metrics: http://{host}:{serving.metrics_export_port}/metrics", flush=True)
        print(f"Logs: {logs} (a line per finished request in replica_dlm_orchestrator_*.log)", flush=True)
        print("Stop with Ctrl-C or SIGTERM.", flush=True)
        stopping = []
        signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        while not stopping:
            time.sleep(0.5)
    return 0


@contextlib.contextmanager
def ray_serving(config) -> Iterator:
    """The Serve app on a local Ray cluster that this process starts, serving once this yields Ray's context; then
    the app deleted and the cluster stopped. Its cache index is serving.redis_url (index_redis)."""
    from services.serving.ray_env import set_ray_env

    serving = config.serving
    set_ray_env()  # before Ray's modules read it
    if loopback(serving.host):
        for key, value in LOCAL_ONLY.items():
            os.environ.setdefault(key, value)
    import ray
    from ray import serve

    from services.cli.client import DlmClient
    from services.cli.serve_config import APP, deploy, serve_config, wait_running

    resolved = os.path.join(tempfile.mkdtemp(prefix="dlm-"), "dlm.yaml")
    with open(resolved, "w") as f:
        yaml.safe_dump({"engine": asdict(config)}, f)
    context = ray.init(
        logging_level="WARNING",
        dashboard_host=serving.host,
        dashboard_port=serving.dashboard_port,
        _metrics_export_port=serving.metrics_export_port,
    )
    deploy(serve_config(serving, resolved))
    try:
        wait_running(timeout_s=600)
        host, port = serving.host, serving.port
        with DlmClient(f"{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}") as client:
            client.wait_ready(timeout=600)
        yield context
    finally:
        # delete the app (its replicas drain their requests), then stop the cluster: serve.shutdown() would leave a
        # graceful_shutdown call on the controller that ray.shutdown kills, which Ray reports as a failed task
        serve.delete(APP)
        ray.shutdown()
