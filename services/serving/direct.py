"""A model deployment's handle whose per-round calls go straight to a replica's own actor (`replica.direct`, run there
by `__ray_call__`), and everything else (health checks, KV reports, the filter's block sizes) through Serve.

The orchestrator learns a replica's actor once, by a Serve call pinned to it (`actor`, serving/replica_router.py).
A replica it names that has gone raises the actor's RayActorError, as a Serve call would: the remote executor moves its
requests and calls again. A stateless deployment (no replica named) takes its calls on its live replicas in turn."""

import itertools
from types import SimpleNamespace

from ray.actor import ActorHandle
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from services.common.contract import Args, Reply
from services.serving.live_replicas import live_replicas
from services.serving.replica import direct, direct_release


class DirectHandle:
    def __init__(self, handle: DeploymentHandle):
        self.handle = handle
        self.actors: dict[str, ActorHandle] = {}  # replica unique id -> its actor
        self.turn = itertools.count()
        self.run = SimpleNamespace(remote=self.call)
        self.release = SimpleNamespace(remote=self.free)

    def __getattr__(self, name: str):
        return getattr(self.handle, name)

    async def call(
        self, method: str, args: list[Args], parents: list[str] | None, replica: str | None = None
    ) -> list[Reply]:
        replica, actor = await self.actor(replica or self.any_replica())
        try:
            return await actor.__ray_call__.remote(direct, method, args, parents)
        except RayActorError:
            self.actors.pop(replica, None)
            raise

    async def actor(self, replica: str | None) -> tuple[str, ActorHandle]:
        """The replica's actor; one Serve call the first time (to any replica where none is named, or the one named
        has gone, so the id that comes back may differ)."""
        if replica in self.actors:
            return replica, self.actors[replica]
        replica, actor = await self.handle.actor.remote(replica=replica)
        self.actors[replica] = actor
        return replica, actor

    def any_replica(self) -> str | None:
        live = live_replicas(self.handle.deployment_name)
        return live[next(self.turn) % len(live)] if live else None

    def free(self, request_ids: list[str], replica: str | None = None) -> None:
        """Free KV where it lives; nothing waits on it."""
        if replica in self.actors:
            self.actors[replica].__ray_call__.remote(direct_release, request_ids)
        else:
            self.handle.release.remote(request_ids, replica=replica)
