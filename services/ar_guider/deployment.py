"""Ray Serve deployment of an AR model (the guider, or the AR baseline): a GuiderHost on its replica."""

import torch
from ray import serve

from services.ar_guider.host import GuiderHost
from services.common.config import EngineConfig, replica_threads
from services.common.models import load_model
from services.serving.replica import ReplicaHost


@serve.deployment(name="guider")
class GuiderDeployment(ReplicaHost, GuiderHost):
    def __init__(self, config: dict, role: str = "guider"):
        cfg = EngineConfig(**config)
        replica_threads(cfg)
        super().__init__(load_model(cfg.path(role), cfg.device, cfg.dtype))
        self.start_replica(cfg.serving.kv_budget_tokens)

    def check_health(self) -> None:
        torch.ones(1, device=self.guider.decoder.device).add_(1)
