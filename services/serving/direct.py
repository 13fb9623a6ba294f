"""A model host's handle on the Serve deployment that runs it: the host's per-round calls go straight to a replica over
its channel (services/serving/channel.py), and everything else (health checks, KV reports, the filter's block sizes)
through Serve. Every frame names the host, as a colocated replica runs several (serving.colocate).

The orchestrator learns a replica's channel once, by a Serve call pinned to it (`endpoint`, serving/replica_router.py).
A replica it names that has gone closes its channel, whose ChannelClosed (a ConnectionError) reaches the remote
executor, which moves its requests and calls again. A stateless deployment (no replica named) takes its calls on its
live replicas in turn, as its router publishes them (the filter's takes PinnedRouter for that); until then on the
replicas it has a channel to, so that no round asks Serve again."""

import asyncio
import itertools
import pickle
from collections.abc import Awaitable
from types import SimpleNamespace

from ray.serve.handle import DeploymentHandle

import services.serving.pickling  # noqa: F401  the contract's classes cross the hop compactly
from services.common.contract import Args, Reply
from services.common.request import Request
from services.serving.channel import Channel, ChannelClosed
from services.serving.live_replicas import live_replicas
from services.serving.request_sync import OutOfSync, Sent


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
        replica = replica or self.any_replica()
        channel = self.channels.get(replica)
        if channel is None or not channel.connected:
            return self.opened(replica, method, args, parents)
        return self.answer(replica, channel, method, args, parents)

    async def opened(self, replica: str | None, method: str, args: list[Args], parents: list[str] | None):
        """The call once the replica's channel is learnt and connected."""
        replica, channel = await self.channel(replica)
        try:
            await channel.ready()
        except ChannelClosed:
            self.closed(replica, channel)
            raise
        return await self.answer(replica, channel, method, args, parents)

    def answer(self, replica: str, channel: Channel, method: str, args: list[Args], parents: list[str] | None):
        """Sends the call on the replica's open channel, each request as what changed since that connection last
        carried it (request_sync.py), now -> its replies."""
        sent: Sent = channel.session
        payload = pickle.dumps(("call", self.host, method, [sent.outgoing(self.host, a) for a in args], parents))
        return self.replies(replica, channel, channel.request(payload), method, args, parents)

    async def replies(self, replica: str, channel: Channel, reply: Awaitable[bytes], method, args, parents):
        sent: Sent = channel.session
        try:
            status, value = pickle.loads(await reply)
        except ChannelClosed:
            self.closed(replica, channel)
            raise
        except asyncio.CancelledError:  # timed out: what the replica made of its copies is unknown, so send whole
            sent.forget(self.host, requests_of(args))
            raise
        if isinstance(value, OutOfSync):  # nothing ran: send each request whole
            sent.forget(self.host)
            return await self.answer(replica, channel, method, args, parents)
        if status == "error":  # what the host made of its copies is unknown: send whole
            sent.forget(self.host, requests_of(args))
            raise value
        return value

    async def channel(self, replica: str | None) -> tuple[str, Channel]:
        """The replica's channel; one Serve call the first time (to any replica where none is named, or the one
        named has gone, so the id that comes back may differ)."""
        if replica in self.channels:
            return replica, self.channels[replica]
        replica, address, token = await self.handle.endpoint.remote(replica=replica)
        if replica not in self.channels:  # else another call learnt it meanwhile: one connection per replica
            self.channels[replica] = Channel(address, token, Sent())  # with the requests the connection carried
        return replica, self.channels[replica]

    def closed(self, replica: str, channel: Channel) -> None:
        """The channel broke: the next call asks Serve for the replica again."""
        if self.channels.get(replica) is channel:
            del self.channels[replica]

    def any_replica(self) -> str | None:
        """A live replica in turn; those with a channel while no router has published the live ones yet."""
        live = live_replicas(self.handle.deployment_name) or list(self.channels)
        return live[next(self.turn) % len(live)] if live else None

    def free(self, request_ids: list[str], replica: str | None = None) -> None:
        """Free KV where it lives; nothing waits on it."""
        if replica in self.channels:
            self.channels[replica].session.forget(self.host, request_ids)
            self.channels[replica].post(pickle.dumps(("release", self.host, request_ids)))
        else:
            self.handle.release.remote(self.host, request_ids, replica=replica)


def requests_of(args: list[Args]) -> list[str]:
    return [call.req.id for call in args if isinstance(getattr(call, "req", None), Request)]
