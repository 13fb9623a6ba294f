"""Ray Serve deployment of the Learn2PD filter: concurrent requests' blocks scored in one MLP call."""

import torch
from ray import serve

from services.common.config import EngineConfig, replica_threads
from services.filter.model import Learn2PDFilter
from services.serving import pickling  # noqa: F401 (registers the compact reducers for the hop)
from services.serving.remote_call import regroup


@serve.deployment(name="filter")
class FilterDeployment:
    def __init__(self, config: dict, max_batch_size: int = 16, batch_wait_timeout_s: float = 0.002):
        cfg = EngineConfig(**config)
        replica_threads(cfg)
        self.model = Learn2PDFilter.load(cfg.path("filter"))
        self.accept_probs.set_max_batch_size(max_batch_size)
        self.accept_probs.set_batch_wait_timeout_s(batch_wait_timeout_s)

    def filter_config(self) -> dict:
        return {"block_size": self.model.config.block_size, "threshold": self.model.config.threshold}

    @serve.batch
    async def accept_probs(self, groups: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        return regroup(self.model.accept_probs_batch([conf for group in groups for conf in group]), groups)

    def check_health(self) -> None:
        self.model(torch.zeros(1, self.model.config.block_size))
