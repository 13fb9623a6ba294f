"""The Serve config `dlm serve` deploys: configs/serve.yaml (what `serve deploy` takes) with the HTTP proxy on
serving.host:serving.http_port and the app reading the resolved dlm YAML. Deploying a config, as `serve run CONFIG`
does, rather than an Application object is what gives the dashboard the app's import path and arguments."""

import os
import time

import yaml

from services.common.config import DEFAULT_CONFIG, ServingConfig

SERVE_CONFIG = os.path.join(os.path.dirname(DEFAULT_CONFIG), "serve.yaml")
APP = "dlm"


def serve_config(serving: ServingConfig, dlm_yaml: str) -> dict:
    config = yaml.safe_load(open(SERVE_CONFIG).read())
    config["http_options"] = {**config.get("http_options", {}), "host": serving.host, "port": serving.http_port}
    [app] = config["applications"]
    app["args"] = {"config": dlm_yaml}
    return config


def deploy(config: dict) -> None:
    """Start Serve with the config's proxy options and deploy its applications, as `serve run CONFIG` does (Ray has
    no public call for it: `serve run` uses these two)."""
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    client = serve_start(
        http_options=schema.http_options.model_dump(),
        grpc_options=schema.grpc_options.model_dump(),
        proxy_location=schema.proxy_location,
    )
    client.deploy_apps(schema)


def wait_running(timeout_s: float) -> None:
    """Until the app is RUNNING; a failed deploy raises with Serve's message instead of waiting out the timeout."""
    from ray import serve

    end = time.monotonic() + timeout_s
    while True:
        app = serve.status().applications.get(APP)
        status = app.status if app is not None else "NOT_STARTED"
        if status == "RUNNING":
            return
        if status == "DEPLOY_FAILED":
            raise RuntimeError(f"Serve could not deploy {APP}: {app.message}")
        if time.monotonic() > end:
            raise TimeoutError(f"Serve app {APP} not RUNNING after {timeout_s} s (status {status})")
        time.sleep(0.5)
