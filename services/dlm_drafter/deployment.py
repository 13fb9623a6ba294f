"""Ray Serve deployment of the drafters: a DrafterHost on its replica. The orchestrator's step sends each batched
method one list of every live request's arguments, so no @serve.batch is needed while one orchestrator runs."""

import torch
from ray import serve

from services.common.config import EngineConfig, replica_threads
from services.common.models import load_model
from services.dlm_drafter.host import DrafterHost
from services.serving.replica import ReplicaHost


@serve.deployment(name="drafter")
class DrafterDeployment(ReplicaHost, DrafterHost):
    def __init__(self, config: dict):
        cfg = EngineConfig(**config)
        replica_threads(cfg)
        models = cfg.models
        causal = load_model(models["drafter"], cfg.device, cfg.dtype) if "drafter" in models else None
        full = models.get("drafter_bidirectional")
        bidirectional = load_model(full, cfg.device, cfg.dtype) if full else None
        super().__init__(causal, bidirectional)
        self.start_replica(cfg.serving.kv_budget_tokens)

    def check_health(self) -> None:
        drafter = self.causal or self.bidirectional
        if drafter is None:
            raise RuntimeError("no drafter model loaded")
        torch.ones(1, device=drafter.decoder.device).add_(1)  # the device is usable
