"""`dlm serve` starts its Ray cluster in the environment the served tests and the measurements ran with."""

import os

import pytest
import ray
import yaml

from services.cli.serve import serve_ray
from services.serving.ray_env import RAY_ENV


class Started(Exception):
    pass


def test_dlm_serve_gives_ray_the_serving_environment(tmp_path, tiny_zoo, monkeypatch):
    config = tmp_path / "dlm.yaml"
    config.write_text(yaml.safe_dump({"engine": {"models": tiny_zoo}}))
    for key in RAY_ENV:  # unset here, restored afterwards
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    seen = {}

    def init(**_):
        seen.update({key: os.environ.get(key) for key in RAY_ENV})
        raise Started  # no cluster: what matters is the environment at this call

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(Started):
        serve_ray(str(config), {})
    assert seen == RAY_ENV
