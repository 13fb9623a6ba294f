"""`dlm serve` starts its Ray cluster in the environment the served tests and the measurements ran with, on loopback
for a loopback host, and deploys the Serve config `serve deploy` takes (served: tests/test_readme_served.py)."""

import os

import pytest
import ray
import yaml
from ray.serve.schema import ServeDeploySchema

import services.cli.serve
from services.cli.cli import main
from services.cli.serve import LOCAL_ONLY, index_redis, serve_ray
from services.cli.serve_config import SERVE_CONFIG, serve_config
from services.common.config import ServingConfig
from services.serving.ray_env import RAY_ENV


class Started(Exception):
    pass


@pytest.mark.parametrize("host, local_only", [("127.0.0.1", True), ("0.0.0.0", False)])
def test_dlm_serve_gives_ray_the_serving_environment(tmp_path, tiny_zoo, monkeypatch, host, local_only):
    config = tmp_path / "dlm.yaml"
    config.write_text(yaml.safe_dump({"engine": {"models": tiny_zoo, "serving": {"host": host}}}))
    for key in {**RAY_ENV, **LOCAL_ONLY}:  # unset here, restored afterwards
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    seen = {}

    def init(**kwargs):
        seen.update({key: os.environ.get(key) for key in {**RAY_ENV, **LOCAL_ONLY}}, kwargs=kwargs)
        raise Started  # no cluster: what matters is the environment and the arguments at this call

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(Started):
        serve_ray(str(config), {})
    kwargs = seen.pop("kwargs")
    assert seen == {**RAY_ENV, **dict.fromkeys(LOCAL_ONLY)} | (LOCAL_ONLY if local_only else {})
    assert (kwargs["dashboard_host"], kwargs["dashboard_port"], kwargs["_metrics_export_port"]) == (host, 8265, 8080)


def test_dlm_serve_deploys_the_device_and_dtype_its_flags_name(tmp_path, tiny_zoo, monkeypatch):
    """`dlm --device cuda serve` loads the replicas' models on the GPU, as `--device` does for every other command
    (it once reached only `serve --local`: on a GPU machine the replicas ran on its CPU)."""
    config = tmp_path / "dlm.yaml"
    config.write_text(yaml.safe_dump({"engine": {"models": tiny_zoo}}))
    deployed = []
    monkeypatch.setattr(services.cli.serve, "serve_on_ray", lambda resolved: deployed.append(resolved) or 0)
    flags = ["--config", str(config), "--device", "cuda:1", "--dtype", "bfloat16"]
    assert main([*flags, "serve", "--redis", "redis://127.0.0.1:1/0"]) == 0  # a URL: no redis-server started
    assert (deployed[0].device, deployed[0].dtype) == ("cuda:1", "bfloat16")


def test_the_deployed_config_is_configs_serve_yaml_on_the_serving_host():
    serving = ServingConfig(host="127.0.0.2", http_port=8001)
    deployed = serve_config(serving, "/tmp/dlm.yaml")
    shipped = yaml.safe_load(open(SERVE_CONFIG).read())
    ServeDeploySchema.model_validate(deployed)
    assert deployed["http_options"] == {"host": "127.0.0.2", "port": 8001}
    [app], [shipped_app] = deployed["applications"], shipped["applications"]
    assert app == {**shipped_app, "args": {"config": "/tmp/dlm.yaml"}}


def test_dlm_serve_runs_its_own_redis_server_when_the_config_names_none():
    """The cache index is Redis always: without serving.redis_url, `dlm serve` starts a redis-server on loopback for
    as long as it serves and stops it after; a configured URL is used as it is."""
    import redis

    serving = ServingConfig()
    with index_redis(serving):
        url = serving.redis_url
        assert url.startswith("redis://127.0.0.1:")
        with redis.Redis.from_url(url) as client:
            assert client.ping()
    with pytest.raises(redis.exceptions.ConnectionError), redis.Redis.from_url(url) as client:
        client.ping()
    given = ServingConfig(redis_url="redis://127.0.0.1:1/0")
    with index_redis(given):
        assert given.redis_url == "redis://127.0.0.1:1/0"
