"""A resumed stream relayed from the orchestrator that owns its request.

Several orchestrators may serve behind one address, so a client's reconnect can land on one that does not decode its
request: the sweep of another one adopted it. Each orchestrator's gRPC server also listens on a private port of its
own and records that address with its lease in the cache index; a resume that meets a live owner (OwnerAlive with
its address) is sent on to that address, where the owner attaches it to the live request (Frontend.attach), and its
messages come back through this server. A relayed call carries RELAYED_HEADER and is never relayed again, so a
request whose ownership moves while the call is on its way ends UNAVAILABLE and the client resumes anew. The relay
is plaintext, as the private port is: under TLS no address is recorded, and a reconnect that lands on a non-owner
is UNAVAILABLE until it lands on the owner.
"""

from collections.abc import AsyncIterator

import grpc

from services.serving.wire import rpc

RELAYED_HEADER = "dlm-relayed"
FORWARDED = ("authorization",)  # the caller's headers the owner needs too


class Relay:
    """One channel per owner address, opened on first use."""

    def __init__(self):
        self.channels: dict[str, grpc.aio.Channel] = {}

    async def stream(self, address: str, request, context: grpc.aio.ServicerContext) -> AsyncIterator:
        """The owner's messages for this resume; the owner's failure status ends the caller's call as it came."""
        channel = self.channels.get(address)
        if channel is None:
            channel = self.channels[address] = grpc.aio.insecure_channel(address)
        sent = [(k, v) for k, v in context.invocation_metadata() or () if k in FORWARDED]
        remaining = context.time_remaining()
        call = rpc.DlmServiceStub(channel).GenerateStream(
            request, metadata=(*sent, (RELAYED_HEADER, "1")), timeout=remaining
        )
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as e:
            await context.abort(e.code(), f"relayed from {address}: {e.details()}")
        finally:
            call.cancel()

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()


def relayed(context: grpc.aio.ServicerContext) -> bool:
    return any(k == RELAYED_HEADER for k, _ in context.invocation_metadata() or ())
