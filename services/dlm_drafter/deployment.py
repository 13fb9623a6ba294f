"""Ray Serve deployment of the drafters: keeps each request's KV cache, batches concurrent calls into one forward."""

from collections import Counter

import torch
from ray import serve

from services.common.config import EngineConfig, replica_threads
from services.common.models import load_model
from services.common.remote_call import Reply, run_batch, run_groups
from services.dlm_drafter.bidirectional import BidirectionalDrafter, Smoothing
from services.dlm_drafter.causal import CausalDrafter
from services.dlm_drafter.serial import SerialBidirectionalDrafter


@serve.deployment(name="drafter")
class DrafterDeployment:
    def __init__(self, config: dict, max_batch_size: int = 16, batch_wait_timeout_s: float = 0.002):
        self.config = EngineConfig(**config)
        replica_threads(self.config)
        self.causal = None
        if "drafter" in self.config.models:
            model = load_model(self.config.models["drafter"], self.config.device, self.config.dtype, reordered=True)
            self.causal = CausalDrafter(model)
        self.full = None
        if "drafter_bidirectional" in self.config.models:
            path = self.config.models["drafter_bidirectional"]
            self.full = BidirectionalDrafter(load_model(path, self.config.device, self.config.dtype))
        self.bidirectional: dict[str, SerialBidirectionalDrafter] = {}  # request id -> its cache mode and BlockCache
        self.batches: Counter[int] = Counter()  # batch size -> forwards
        for method in (self.propose, self.forward):
            method.set_max_batch_size(max_batch_size)
            method.set_batch_wait_timeout_s(batch_wait_timeout_s)

    def drafter(self) -> CausalDrafter:
        if self.causal is None:
            raise ValueError("no causal drafter configured (models.drafter)")
        return self.causal

    @serve.batch
    async def propose(self, groups: list[list[tuple]]) -> list[list[Reply]]:
        """Each caller sends a list of (request, region, with logits) -> Proposal; all in one forward."""
        self.batches[sum(map(len, groups))] += 1
        replies = run_groups(lambda calls: self.drafter().propose_batch([c[:2] for c in calls]), groups)
        return [
            [without_logits(r, c[2]) for r, c in zip(rs, g, strict=True)] for rs, g in zip(replies, groups, strict=True)
        ]

    @serve.batch
    async def forward(self, groups: list[list[tuple]]) -> list[list[Reply]]:
        """Lists of (request, ids, positions, groups) -> logits: the slot strategy's verification and completion."""
        self.batches[sum(map(len, groups))] += 1
        return run_groups(self.drafter().forward_batch, groups)

    def propose_full(self, call: tuple) -> Reply:
        """call: (request, region, cache mode, smoothing, with logits) on the bidirectional drafter, unbatched."""
        req, region, cache, smoothing, logits = call
        if self.full is None:
            raise ValueError("no bidirectional drafter configured (models.drafter_bidirectional)")
        if req.id not in self.bidirectional:
            self.bidirectional[req.id] = SerialBidirectionalDrafter(
                self.full, cache, Smoothing() if smoothing else None
            )
        drafter = self.bidirectional[req.id]
        return without_logits(
            run_batch(lambda calls: [drafter.propose(r, g) for r, g in calls], [(req, region)])[0], logits
        )

    def release(self, request_id: str) -> None:
        if self.causal is not None:
            self.causal.release(request_id)
        self.bidirectional.pop(request_id, None)

    def held(self) -> dict[str, int]:
        """Request id -> KV tokens this replica holds for it."""
        held = {rid: self.causal.cached_tokens(rid) for rid in self.causal.caches} if self.causal else {}
        held.update(
            {rid: d.states[rid].kv.get_seq_length() for rid, d in self.bidirectional.items() if rid in d.states}
        )
        return held

    def replica_id(self) -> str:
        """The id the cache index records as holding a request's KV."""
        return serve.get_replica_context().replica_id.unique_id

    def batch_sizes(self) -> dict[int, int]:
        return dict(self.batches)

    def check_health(self) -> None:
        model = (self.causal.model if self.causal else self.full.model) if (self.causal or self.full) else None
        if model is None:
            raise RuntimeError("no drafter model loaded")
        torch.ones(1, device=model.device).add_(1)  # the device is usable


def without_logits(reply: Reply, keep: bool) -> Reply:
    """The full distribution crosses the hop only for gates that fuse it (credit decoding)."""
    if not keep:
        reply.value.logits = None
    return reply
