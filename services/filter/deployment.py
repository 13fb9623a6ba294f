"""Ray Serve deployment of the Learn2PD filter: a FilterHost on its replica."""

import torch
from ray import serve

from services.common.config import EngineConfig, replica_threads
from services.filter.host import FilterHost
from services.filter.model import Learn2PDFilter
from services.serving import pickling  # noqa: F401 (registers the compact reducers for the hop)
from services.serving.replica import ReplicaHost


@serve.deployment(name="filter")
class FilterDeployment(ReplicaHost, FilterHost):
    def __init__(self, config: dict):
        cfg = EngineConfig(**config)
        replica_threads(cfg)
        super().__init__(Learn2PDFilter.load(cfg.path("filter")))
        self.start_telemetry()

    def check_health(self) -> None:
        self.model(torch.zeros(1, self.model.config.block_size))
