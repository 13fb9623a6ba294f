"""Remote stage components: the same interfaces as the in-process drafters, guider and filter, over Serve handles.

The round loop and the strategies do not change: the orchestrator's Engine gets a RemoteModelPool instead of a
ModelPool. Each call ships a copy of the request; its effects (stat counters, sampling RNG) come back in the reply.
"""

import time

import torch
from ray.serve.handle import DeploymentHandle

from services.common.config import EngineConfig
from services.common.models import ModelMeta, load_meta
from services.common.proposal import Proposal, Region, Verdict
from services.common.request import Request
from services.dlm_drafter.bidirectional import Smoothing
from services.filter.model import FilterConfig
from services.orchestrator.batcher import Call, MicroBatches
from services.orchestrator.engine import first_role
from services.serving import pickling  # noqa: F401 (registers the compact reducers for the hop)
from services.serving.remote_call import absorb


class RemoteCausalDrafter:
    family = "causal"

    def __init__(self, pool: "RemoteModelPool", logits: bool = False):
        self.handle, self.logits, self.micro_batches = pool.handle("drafter"), logits, pool.micro_batches
        self.proposing, self.forwarding = pool.batcher("drafter", "propose"), pool.batcher("drafter", "forward")

    def propose(self, req: Request, region: Region) -> Proposal:
        return absorb(req, self.proposing(req.id, (req, region, self.logits)))

    def forward(self, req: Request, ids: torch.Tensor, positions: torch.Tensor, groups: torch.Tensor | None = None):
        return absorb(req, self.forwarding(req.id, (req, ids, positions, groups)))

    def release(self, request_id: str) -> None:
        self.micro_batches.leave(request_id)
        self.handle.release.remote(request_id).result()


class RemoteBidirectionalDrafter(RemoteCausalDrafter):
    family = "bidirectional"

    def __init__(self, pool: "RemoteModelPool", cache: str, smoothing: bool, logits: bool):
        super().__init__(pool, logits)
        self.cache, self.smoothing = cache, smoothing

    def propose(self, req: Request, region: Region) -> Proposal:
        call = (req, region, self.cache, self.smoothing, self.logits)
        return absorb(req, self.handle.propose_full.remote(call).result())


class RemoteGuider:
    def __init__(self, pool: "RemoteModelPool", role: str):
        self.handle, self.micro_batches = pool.handle(role), pool.micro_batches
        self.verifying, self.forwarding = pool.batcher(role, "verify"), pool.batcher(role, "forward")

    def verify(self, req: Request, start: int, draft: torch.Tensor, top_k: int) -> Verdict:
        return absorb(req, self.verifying(req.id, (req, start, draft, top_k)))

    def forward(self, req: Request, start: int, draft: torch.Tensor) -> torch.Tensor:
        return absorb(req, self.forwarding(req.id, (req, start, draft)))

    def release(self, request_id: str) -> None:
        self.micro_batches.leave(request_id)
        self.handle.release.remote(request_id).result()


class RemoteFilter:
    def __init__(self, pool: "RemoteModelPool"):
        self.config = FilterConfig(**pool.handle("filter").filter_config.remote().result())
        self.scoring = pool.batcher("filter", "accept_probs")

    def accept_probs(self, confidence: torch.Tensor, request_id: str) -> torch.Tensor:
        return self.scoring(request_id, confidence)


class RemoteModelPool:
    """ModelPool's interface over the deployments; `load` waits until a role's deployment is healthy."""

    def __init__(self, config: EngineConfig, handles: dict[str, DeploymentHandle]):
        self.config, self.handles = config, handles
        self.metadata: ModelMeta | None = None
        self.remote_filter: RemoteFilter | None = None
        self.batchers: dict[tuple[str, str], Call] = {}
        self.micro_batches = MicroBatches(config.serving.micro_batches, config.serving.gang_wait_s)

    def batcher(self, role: str, method: str) -> Call:
        """One client-side batcher per deployment method and micro-batch, shared by the requests."""
        if (role, method) not in self.batchers:
            remote = getattr(self.handle(role), method)
            send = lambda items: remote.remote(items).result()  # noqa: E731
            self.batchers[role, method] = self.micro_batches.batcher(send)
        return self.batchers[role, method]

    def handle(self, role: str) -> DeploymentHandle:
        if role not in self.handles:
            raise ValueError(f"model {role!r} is not served by this deployment (served: {sorted(self.handles)})")
        return self.handles[role]

    def load(self, role: str, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        deployment = "drafter" if role == "drafter_bidirectional" else role  # one deployment hosts both drafters
        while True:
            try:
                self.handle(deployment).check_health.remote().result(timeout_s=max(deadline - time.monotonic(), 1))
                return
            except ValueError:
                raise
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def meta(self) -> ModelMeta:
        if self.metadata is None:
            self.metadata = load_meta(self.config.path(first_role(self.config)))
        return self.metadata

    def drafter(self, family: str, cache: str = "none", smoothing: Smoothing | None = None, logits: bool = False):
        if family == "causal":
            return RemoteCausalDrafter(self, logits)
        return RemoteBidirectionalDrafter(self, cache, smoothing is not None, logits)

    def guider(self) -> RemoteGuider:
        return RemoteGuider(self, "guider")

    def autoregressive(self, role: str) -> RemoteGuider:
        if role == "drafter":
            raise ValueError("model 'drafter' decodes AR only in-process; the services serve model=ar or guider")
        return RemoteGuider(self, role)

    def filter(self) -> RemoteFilter:
        if self.remote_filter is None:
            self.remote_filter = RemoteFilter(self)
        return self.remote_filter

    def held(self) -> dict[str, dict[str, int]]:
        """Per deployment, request id -> KV tokens it holds."""
        return {
            role: handle.held.remote().result()
            for role, handle in self.handles.items()
            if role in ("drafter", "guider", "ar")
        }
