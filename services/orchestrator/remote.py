"""The Ray Serve model deployments as the engine's hosts: each of a step's call groups goes out as one Serve call,
all of them at once, and the step awaits them together. A request crosses the hop as a copy; what the call did to
it (the sampling RNG, tokens processed) comes back in its Reply."""

import asyncio
import time
from collections import Counter

from ray.serve.handle import DeploymentHandle

from services.common.config import EngineConfig
from services.common.models import ModelMeta, load_meta
from services.orchestrator.loop import Groups, Parents, Results
from services.orchestrator.pool import first_role
from services.serving import pickling  # noqa: F401 (registers the compact reducers for the hop)


class RemoteHosts:
    def __init__(self, config: EngineConfig, handles: dict[str, DeploymentHandle]):
        self.config, self.handles = config, handles
        self.roles = frozenset(config.models)  # AR decoding on the drafter (drafter_ar) runs in process only
        self.metadata: ModelMeta | None = None
        self.block_size: int | None = None
        self.batches: dict[str, Counter[int]] = {role: Counter() for role in handles}  # batch size -> calls

    def handle(self, role: str) -> DeploymentHandle:
        deployment = "drafter" if role == "drafter_bidirectional" else role  # one deployment hosts both drafters
        if deployment not in self.handles:
            raise ValueError(f"model {role!r} is not served by this deployment (served: {sorted(self.handles)})")
        return self.handles[deployment]

    async def execute(self, groups: Groups, parents: Parents = None) -> Results:
        """Each group as one call of its replica's `run` (services/serving/replica.py), with its calls' round
        traceparents when traced."""
        keys = list(groups)
        for role, method in keys:
            self.batches[role][len(groups[role, method])] += 1
        calls = [
            self.handle(role).run.remote(method, groups[role, method], parents and parents[role, method])
            for role, method in keys
        ]
        return dict(zip(keys, await asyncio.gather(*calls, return_exceptions=True), strict=True))

    def release(self, role: str, request_ids: list[str]) -> None:
        self.handle(role).release.remote(request_ids)  # nothing waits on it

    def filter_block_size(self) -> int:
        if self.block_size is None:
            raise ValueError("model 'filter' is not served here")
        return self.block_size

    async def start(self, timeout_s: float = 600.0) -> None:
        """Wait until every deployment is healthy."""
        deadline = time.monotonic() + timeout_s
        for role in self.handles:
            while True:
                try:
                    await self.handles[role].check_health.remote()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
        if "filter" in self.handles:
            self.block_size = await self.handles["filter"].block_size.remote()

    def meta(self) -> ModelMeta:
        if self.metadata is None:
            self.metadata = load_meta(self.config.path(first_role(self.config)))
        return self.metadata

    async def held(self) -> dict[str, dict[str, int]]:
        """Per deployment, request id -> KV tokens it holds."""
        roles = [role for role in ("drafter", "guider", "ar") if role in self.handles]
        held = await asyncio.gather(*(self.handles[role].held.remote() for role in roles))
        return dict(zip(roles, held, strict=True))
