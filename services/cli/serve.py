"""`dlm serve`: a local Ray cluster, the Serve app, gRPC on HOST:PORT and the OpenAI-compatible API on
HOST:serving.http_port until interrupted."""

import os
import signal
import tempfile
import time
from dataclasses import asdict

import yaml


def serve_ray(config_path: str, flags: dict) -> int:
    """flags: serving keys given on the command line (None: keep the config's)."""
    from services.serving.ray_env import set_ray_env

    set_ray_env()  # before Ray's modules read it
    import ray
    from ray import serve

    from services.cli.client import DlmClient
    from services.common.config import EngineConfig
    from services.orchestrator.cluster.app import build_app

    config = EngineConfig.from_yaml(config_path, serving=flags)
    host, port = config.serving.host, config.serving.port
    resolved = os.path.join(tempfile.mkdtemp(prefix="dlm-"), "dlm.yaml")
    with open(resolved, "w") as f:
        yaml.safe_dump({"engine": asdict(config)}, f)

    metrics_port, http_port = config.serving.metrics_export_port, config.serving.http_port
    # a local run keeps Ray's endpoints (Prometheus metrics included) on loopback
    context = ray.init(logging_level="WARNING", _metrics_export_port=metrics_port, _node_ip_address="127.0.0.1")
    serve.start(http_options={"host": host, "port": http_port})
    serve.run(build_app({"config": resolved}), name="dlm", route_prefix="/")
    with DlmClient(f"{host}:{port}") as client:
        client.wait_ready(timeout=600)
    print(f"dlm.v1.DlmService serving on {host}:{port}", flush=True)
    print(f"OpenAI-compatible API: base_url http://{host}:{http_port}/v1", flush=True)
    print(f"Ray dashboard: http://{context.dashboard_url} (token: `ray get-auth-token`)", flush=True)
    print(f"Prometheus metrics: http://127.0.0.1:{metrics_port}/metrics", flush=True)
    stopping = []
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    while not stopping:
        time.sleep(0.5)
    serve.shutdown()
    ray.shutdown()
    return 0
