"""Ray Serve deployment of the Learn2PD filters: a FilterHost on its replica, with each configured family's filter."""

import torch
from ray import serve

from services.common.config import EngineConfig, replica_threads
from services.filter.host import FilterHost, configured_filters
from services.serving.replica import ReplicaHost


@serve.deployment(name="filter")
class FilterDeployment(ReplicaHost, FilterHost):
    def __init__(self, config: dict):
        cfg = EngineConfig(**config)
        replica_threads(cfg)
        super().__init__(configured_filters(cfg.models))
        self.start_replica(cfg.serving.kv_budget_tokens)

    def check_health(self) -> None:
        for f in self.filters.values():
            f(torch.zeros(1, f.config.block_size))
