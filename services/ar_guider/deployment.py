"""Ray Serve deployment of an AR model (the guider, or the AR baseline): KV per request, batched verification."""

from collections import Counter

import torch
from ray import serve

from services.ar_guider.guider import Guider
from services.common.config import EngineConfig, replica_threads
from services.common.models import load_model
from services.serving import pickling  # noqa: F401 (registers the compact reducers for the hop)
from services.serving.remote_call import Reply, run_groups


@serve.deployment(name="guider")
class GuiderDeployment:
    def __init__(
        self, config: dict, role: str = "guider", max_batch_size: int = 16, batch_wait_timeout_s: float = 0.002
    ):
        cfg = EngineConfig(**config)
        replica_threads(cfg)
        self.guider = Guider(
            load_model(cfg.path(role), cfg.device, cfg.dtype), role="guider" if role == "guider" else "drafter"
        )
        self.batches: Counter[int] = Counter()
        for method in (self.verify, self.forward):
            method.set_max_batch_size(max_batch_size)
            method.set_batch_wait_timeout_s(batch_wait_timeout_s)

    @serve.batch
    async def verify(self, groups: list[list[tuple]]) -> list[list[Reply]]:
        """Lists of (request, start, draft, top_k) -> Verdict, all in one forward."""
        self.batches[sum(map(len, groups))] += 1
        top_k = max(call[3] for group in groups for call in group)
        replies = run_groups(lambda calls: self.guider.verify_batch([c[:3] for c in calls], top_k), groups)
        for reply, call in zip(sum(replies, []), sum(groups, []), strict=True):
            reply.value.topk = reply.value.topk[:, : call[3]]
        return replies

    @serve.batch
    async def forward(self, groups: list[list[tuple]]) -> list[list[Reply]]:
        """Lists of (request, start, draft) -> logits [M + 1, V]; AR decoding asks with an empty draft."""
        self.batches[sum(map(len, groups))] += 1
        return run_groups(self.guider.forward_batch, groups)

    def release(self, request_id: str) -> None:
        self.guider.release(request_id)

    def held(self) -> dict[str, int]:
        return {rid: cache.kv.get_seq_length() for rid, cache in self.guider.caches.items()}

    def replica_id(self) -> str:
        """The id the cache index records as holding a request's KV."""
        return serve.get_replica_context().replica_id.unique_id

    def batch_sizes(self) -> dict[int, int]:
        return dict(self.batches)

    def check_health(self) -> None:
        torch.ones(1, device=self.guider.model.device).add_(1)
