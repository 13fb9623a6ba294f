"""A model host's handle on the Serve deployment that runs it: the host's per-round calls go straight to a replica over
its channel (services/serving/channel.py), and everything else (health checks, KV reports, the filter's block sizes)
through Serve. Every frame names the host, as a colocated replica runs several (serving.colocate).

The orchestrator learns a replica's channel once, by a Serve call pinned to it (`endpoint`, serving/replica_router.py).
A replica it names that has gone closes its channel, whose ChannelClosed (a ConnectionError) reaches the remote
executor, which moves its requests and calls again. A stateless deployment (no replica named) takes its calls on its
live replicas in turn, as its router publishes them (the filter's takes PinnedRouter for that); until then on the
replicas it has a channel to, so that no round asks Serve again."""

import itertools
import pickle
from collections.abc import Awaitable
from types import SimpleNamespace

from ray.serve.handle import DeploymentHandle

import services.serving.pickling  # noqa: F401  the contract's classes cross the hop compactly
from services.common.contract import Args, Reply
from services.serving.channel import Channel, ChannelClosed
from services.serving.live_replicas import live_replicas


class DirectHandle:
    def __init__(self, handle: DeploymentHandle, host: str):
        self.handle, self.host = handle, host
        self.channels: dict[str, Channel] = {}  # replica unique id -> its channel
        self.turn = itertools.count()
        self.run = SimpleNamespace(remote=self.start)
        self.release = SimpleNamespace(remote=self.free)

    def __getattr__(self, name: str):
        return getattr(self.handle, name)

    def start(
        self, method: str, args: list[Args], parents: list[str] | None, replica: str | None = None
    ) -> Awaitable[list[Reply]]:
        """The call, its frame already written when this returns where the replica's channel is open: the replica
        starts computing before the event loop runs anything else (a step's calls went out up to 1.1 ms late behind
        the streams and index writes of the step before). Otherwise the channel is learnt and opened first."""
        payload, replica = pickle.dumps(("call", self.host, method, args, parents)), replica or self.any_replica()
        channel = self.channels.get(replica)
        if channel is None or not channel.connected:
            return self.opened(replica, payload)
        return self.answer(replica, channel.request(payload))

    async def opened(self, replica: str | None, payload: bytes) -> list[Reply]:
        """The call once the replica's channel is learnt and connected."""
        replica, channel = await self.channel(replica)
        return await self.answer(replica, channel.call(payload))

    async def answer(self, replica: str, reply: Awaitable[bytes]) -> list[Reply]:
        try:
            status, value = pickle.loads(await reply)
        except ChannelClosed:
            self.channels.pop(replica, None)
            raise
        if status == "error":
            raise value
        return value

    async def channel(self, replica: str | None) -> tuple[str, Channel]:
        """The replica's channel; one Serve call the first time (to any replica where none is named, or the one
        named has gone, so the id that comes back may differ)."""
        if replica in self.channels:
            return replica, self.channels[replica]
        replica, address, token = await self.handle.endpoint.remote(replica=replica)
        self.channels[replica] = Channel(address, token)
        return replica, self.channels[replica]

    def any_replica(self) -> str | None:
        """A live replica in turn; those with a channel while no router has published the live ones yet."""
        live = live_replicas(self.handle.deployment_name) or list(self.channels)
        return live[next(self.turn) % len(live)] if live else None

    def free(self, request_ids: list[str], replica: str | None = None) -> None:
        """Free KV where it lives; nothing waits on it."""
        if replica in self.channels:
            self.channels[replica].post(pickle.dumps(("release", self.host, request_ids)))
        else:
            self.handle.release.remote(self.host, request_ids, replica=replica)
