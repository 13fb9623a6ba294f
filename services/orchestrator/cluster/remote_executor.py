"""The executor over the Ray Serve model deployments (services/common/contract.py): each of a step's call groups
goes out as one Serve call, all of them at once, and the step awaits them together. A request crosses the hop as a
copy; what the call did to it (the sampling RNG, tokens processed) comes back in its Reply.

A deployment that holds KV may run several replicas: each group is split by the replica that holds each request's KV
(engine/placement.py, the ledger), one call per replica. When a replica is lost (its actor died, or a call to it
timed out) its requests move to a live replica, which rebuilds their KV from the request it is sent, and the call
goes again: the round goes on, later; a stateless host's call (the filter's) goes again to any live replica. A
request that finds no replica within `serving.resume_timeout_s` fails with Unavailable."""

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable

from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle

import services.serving.pickling  # noqa: F401  the contract's classes cross the hop compactly
from services.common.config import EngineConfig
from services.common.contract import ROLES, Args, Groups, Parents, Reply, Results, kv_hosts
from services.common.models import ModelMeta, load_meta
from services.common.placement import Placement
from services.orchestrator.engine.local_executor import first_model
from services.orchestrator.engine.scheduler import Unavailable
from services.serving.channel import ChannelClosed
from services.serving.live_replicas import live_replicas

log = logging.getLogger(__name__)

# the replica, not the call, failed: move its requests and call again
LOST = (RayActorError, ActorUnavailableError, ChannelClosed, TimeoutError)
RETRY_S = 0.2  # between looks for a live replica while Serve restarts one


class RemoteExecutor:
    def __init__(self, config: EngineConfig, handles: dict[str, DeploymentHandle]):
        self.config, self.handles = config, handles
        kv = [host for host in kv_hosts(config.models) if host in handles]
        self.placement = Placement(kv, self.live, config.serving.kv_budget_tokens)
        self.roles = frozenset(config.models)  # AR decoding on the drafter (drafter_ar) runs in process only
        self.metadata: ModelMeta | None = None
        self.block_sizes: dict[str, int] = {}  # drafter family -> its filter's block
        self.batches: dict[str, Counter[int]] = {role: Counter() for role in handles}  # batch size -> calls
        self.resuming: set[str] = set()  # requests whose replica was lost and that wait for another

    def live(self, host: str) -> list[str]:
        """The live replicas of the Serve deployment that runs the host (several hosts share one when colocated)."""
        return live_replicas(self.handles[host].deployment_name)

    def deployments(self) -> dict[str, DeploymentHandle]:
        """Serve deployment -> a handle on it: one each, however many hosts it runs."""
        return {handle.deployment_name: handle for handle in self.handles.values()}

    def deployment(self, role: str) -> str:
        deployment = ROLES[role].host
        if deployment not in self.handles:
            raise ValueError(f"model {role!r} is not served by this deployment (served: {sorted(self.handles)})")
        return deployment

    def replica_of(self, request_id: str, role: str) -> str:
        """The replica holding a request's KV for `role`, or the deployment's name for a stateless one."""
        deployment = self.deployment(role)
        return self.placement.replica(request_id, deployment) or deployment

    def execute(self, groups: Groups, parents: Parents = None) -> asyncio.Future[Results]:
        """Each group as calls of its replicas' `run` (services/serving/replica.py), with its calls' round
        traceparents when traced; every call is sent before this returns (DirectHandle.start)."""
        keys = list(groups)
        calls = [self.call(*key, groups[key], parents and parents[key]) for key in keys]
        return asyncio.ensure_future(gathered(keys, calls))

    def call(self, role: str, method: str, args: list[Args], parents: list[str] | None) -> Awaitable[list[Reply]]:
        """One group: a call per replica holding its requests' KV (one call for a stateless deployment), sent now.
        What fails before its calls are out fails the group alone, as a call's failure would."""
        try:
            deployment = self.deployment(role)
            if deployment not in self.placement.deployments:
                sent = self.send(role, deployment, None, method, args, parents)
                return self.stateless(sent, role, deployment, method, args, parents)
            live, parts = set(self.placement.live(deployment)), {}
            for i, call in enumerate(args):
                replica = self.placement.replica(call.req.id, deployment)
                if replica is None or (live and replica not in live):  # not placed yet, or its replica scaled down
                    replica = self.placement.move(call.req.id, deployment, set())
                parts.setdefault(replica, []).append(i)
            shares = [self.pinned(role, deployment, r, method, args, parents, at) for r, at in parts.items()]
        except Exception as e:
            return raised(e)
        return merged(len(args), list(parts.values()), shares)

    def pinned(self, role, deployment, replica, method, args, parents, at: list[int]) -> Awaitable[list[Reply]]:
        """The share of a group at positions `at` on one replica, sent now."""
        share, share_parents = [args[i] for i in at], parents and [parents[i] for i in at]
        sent = self.send(role, deployment, replica, method, share, share_parents)
        return self.settled(sent, role, deployment, replica, method, share, share_parents)

    async def stateless(self, sent, role, deployment, method, args, parents) -> list[Reply]:
        """A stateless host's replies (the filter's); sent again to a live replica while its replica was lost, as
        Serve restarts it (a colocated replica's death takes the filter with the drafter and the guider)."""
        give_up = time.monotonic() + self.config.serving.resume_timeout_s
        while True:
            try:
                return await sent
            except LOST as e:
                if time.monotonic() > give_up:
                    raise Unavailable(f"{deployment}: its replica was lost ({e!r}) and no other answered") from e
                log.warning("%s replica lost (%r): calling another", deployment, e)
                await asyncio.sleep(RETRY_S)
            sent = self.send(role, deployment, None, method, args, parents)

    async def settled(self, sent, role, deployment, replica, method, share, share_parents) -> list[Reply]:
        """A share's replies; moved and sent again if its replica is lost."""
        try:
            return await sent
        except LOST as e:
            log.warning("%s replica %s lost (%r): moving %d requests", deployment, replica, e, len(share))
            await self.move([call.req.id for call in share], deployment, replica, e)
        return await self.call(role, method, share, share_parents)

    def send(self, role, deployment, replica, method, args, parents) -> Awaitable[list[Reply]]:
        self.batches[role][len(args)] += 1
        response = self.handles[deployment].run.remote(method, args, parents, replica=replica)
        return asyncio.wait_for(response, self.config.serving.call_timeout_s)

    async def move(self, request_ids: list[str], deployment: str, lost: str, why: BaseException) -> None:
        """Re-place requests away from a lost replica, waiting for Serve to start one if none is live."""
        give_up = time.monotonic() + self.config.serving.resume_timeout_s
        self.resuming.update(request_ids)
        try:
            for rid in request_ids:
                while self.placement.move(rid, deployment, {lost}) is None:
                    if time.monotonic() > give_up:
                        raise Unavailable(f"{deployment} replica {lost} was lost ({why!r}) and no other took over")
                    await asyncio.sleep(RETRY_S)
        finally:
            self.resuming.difference_update(request_ids)

    def release(self, host: str, request_ids: list[str]) -> None:
        """Free the KV of ended requests where it lives; nothing waits on it."""
        deployment = self.deployment(host)
        if deployment not in self.placement.deployments:
            return
        held: dict[str | None, list[str]] = {}
        for rid in request_ids:
            held.setdefault(self.placement.replica(rid, deployment), []).append(rid)
        for replica, ids in held.items():
            self.handles[deployment].release.remote(ids, replica=replica)

    def filter_block_size(self, drafter: str) -> int:
        if drafter not in self.block_sizes:
            raise ValueError(f"no filter for the {drafter} drafter is served here")
        return self.block_sizes[drafter]

    async def start(self, timeout_s: float = 600.0) -> None:
        """Wait until every deployment is healthy."""
        deadline = time.monotonic() + timeout_s
        for handle in self.deployments().values():
            while True:
                try:
                    await handle.check_health.remote()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
        if "filter" in self.handles:
            self.block_sizes = await self.handles["filter"].block_sizes.remote()

    def meta(self) -> ModelMeta:
        if self.metadata is None:
            self.metadata = load_meta(self.config.path(first_model(self.config)))
        return self.metadata

    async def held(self) -> dict[str, dict[str, int]]:
        """Per deployment, request id -> KV tokens it holds."""
        roles = [role for role in ("drafter", "guider", "ar") if role in self.handles]
        held = await asyncio.gather(*(self.handles[role].held.remote(role) for role in roles))
        return dict(zip(roles, held, strict=True))


async def gathered(keys: list, calls: list[Awaitable[list[Reply]]]) -> Results:
    """Each group's replies, or what failed it."""
    return dict(zip(keys, await asyncio.gather(*calls, return_exceptions=True), strict=True))


async def merged(size: int, positions: list[list[int]], shares: list[Awaitable[list[Reply]]]) -> list[Reply]:
    """A group's replies in its order, each share's at its positions; a share's failure fails the group."""
    replies: list[Reply] = [None] * size
    for at, share in zip(positions, await asyncio.gather(*shares, return_exceptions=True), strict=True):
        if isinstance(share, BaseException):
            raise share
        for i, reply in zip(at, share, strict=True):
            replies[i] = reply
    return replies


async def raised(error: Exception) -> list[Reply]:
    """A group that fails before any call is sent, as its call would."""
    raise error
