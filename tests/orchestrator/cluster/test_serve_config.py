import os

import yaml

from services.common.config import DEFAULT_CONFIG, EngineConfig


def test_serve_config_is_accepted_by_ray_serve():
    from ray.serve.schema import ServeDeploySchema

    with open(os.path.join(os.path.dirname(DEFAULT_CONFIG), "serve.yaml")) as f:
        config = ServeDeploySchema(**yaml.safe_load(f))
    assert config.applications[0].import_path == "services.orchestrator.cluster.app:build_app"


def test_default_config_reads_serving_section():
    cfg = EngineConfig.from_yaml(DEFAULT_CONFIG)
    assert cfg.serving.port == 50051 and cfg.serving.host == "127.0.0.1"
    assert set(cfg.models) == {"drafter", "drafter_bidirectional", "guider", "ar", "filter", "filter_bidirectional"}
