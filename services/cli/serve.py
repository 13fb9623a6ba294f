"""`dlm serve`: a local Ray cluster, the Serve app, gRPC on HOST:PORT and the OpenAI-compatible API on
HOST:serving.http_port until interrupted."""

import os
import signal
import tempfile
import time

import yaml


def serve_ray(config_path: str, host: str, port: int, redis_url: str | None) -> int:
    import ray
    from ray import serve

    from services.cli.client import DlmClient
    from services.common.config import ServingConfig
    from services.orchestrator.app import build_app

    with open(config_path) as f:
        raw = yaml.safe_load(f) or {}
    engine = raw.setdefault("engine", {})
    base = os.path.dirname(os.path.abspath(config_path))
    engine["models"] = {role: os.path.join(base, path) for role, path in engine.get("models", {}).items()}
    engine.setdefault("serving", {}).update({"host": host, "port": port, "redis_url": redis_url})
    resolved = os.path.join(tempfile.mkdtemp(prefix="dlm-"), "dlm.yaml")
    with open(resolved, "w") as f:
        yaml.safe_dump(raw, f)

    http_port = engine["serving"].get("http_port", ServingConfig().http_port)
    context = ray.init(logging_level="WARNING")
    serve.start(http_options={"host": host, "port": http_port})
    serve.run(build_app({"config": resolved}), name="dlm", route_prefix="/")
    with DlmClient(f"{host}:{port}") as client:
        client.wait_ready(timeout=600)
    print(f"dlm.v1.DlmService serving on {host}:{port}", flush=True)
    print(f"OpenAI-compatible API: base_url http://{host}:{http_port}/v1", flush=True)
    print(f"Ray dashboard: http://{context.dashboard_url} (token: `ray get-auth-token`)", flush=True)
    stopping = []
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    while not stopping:
        time.sleep(0.5)
    serve.shutdown()
    ray.shutdown()
    return 0
