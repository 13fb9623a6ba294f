"""A no-op round trip through each way the orchestrator could call a replica: a Serve handle, a plain Ray actor call, a
closure run on a Serve replica's own actor (`__ray_call__`), a Ray Compiled Graph channel (ray.dag InputNode +
experimental_compile), a gRPC unary over loopback, and a Serve replica's channel (services/serving/channel.py, how
the rounds' calls go). Each call carries a small payload (the size of a c=1 pipeline round's arguments) and is
awaited on an event loop, as the orchestrator awaits its calls, before the next; milliseconds, median and p90 of
CALLS calls after 20 warm-up calls.
`PYTHONPATH=. python scripts/transport_rtt.py [CALLS]`

Ray 2.60, a shared 2-core CPU, 300 calls, 2 KiB, ms median / p90 (one run, 2026-11-26):
Serve handle 4.90 / 8.57; Ray actor call 1.93 / 5.26; Serve replica's actor (__ray_call__, the rounds' transport
before the channel) 2.54 / 6.00; compiled graph, one actor 0.345 / 0.421; compiled graph, 2 actors in a row
0.302 / 0.369; gRPC unary 0.290 / 0.416; Serve replica's channel 0.040 / 0.054."""

import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

from services.serving.ray_env import set_ray_env

set_ray_env()

import grpc  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray.dag import InputNode  # noqa: E402

from services.serving.channel import Channel, ChannelServer  # noqa: E402

PAYLOAD = bytes(2048)


@ray.remote(num_cpus=0)
class Echo:
    def noop(self, payload: bytes) -> bytes:
        return payload


@serve.deployment(ray_actor_options={"num_cpus": 0}, logging_config={"log_level": "WARNING"})
class EchoDeployment:
    def __init__(self):
        self.channel = ChannelServer(ray.util.get_node_ip_address(), lambda payload, session: payload, lambda: None)

    def noop(self, payload: bytes) -> bytes:
        return payload

    def endpoint(self) -> tuple[tuple[str, int], bytes]:
        return self.channel.address, self.channel.token

    def actor(self) -> ray.actor.ActorHandle:
        return ray.get_runtime_context().current_actor


def on_replica(replica_actor, payload: bytes) -> bytes:
    return payload


async def timed(call: Callable[[], Awaitable[object]], calls: int) -> list[float]:
    for _ in range(20):
        await call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        times.append(time.perf_counter() - start)
    return times


async def noop(payload: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return payload


async def grpc_echo() -> tuple[grpc.aio.Server, Callable[[bytes], Awaitable[bytes]]]:
    handler = grpc.method_handlers_generic_handler("rtt.Echo", {"Noop": grpc.unary_unary_rpc_method_handler(noop)})
    server = grpc.aio.server(handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, grpc.aio.insecure_channel(f"127.0.0.1:{port}").unary_unary("/rtt.Echo/Noop")


async def compiled(*actors) -> Callable[[bytes], Awaitable[bytes]]:
    """The actors' noop in a row as one compiled graph; its call awaits the graph's output."""
    with InputNode() as node:
        for actor in actors:
            node = actor.noop.bind(node)
    graph = node.experimental_compile(enable_asyncio=True)

    async def call(payload: bytes) -> bytes:
        return await (await graph.execute_async(payload))

    return call


async def measure(calls: int) -> dict[str, list[float]]:
    handle = serve.run(EchoDeployment.bind(), name="rtt")
    replica = await handle.actor.remote()
    channel = Channel(*await handle.endpoint.remote())
    echo = Echo.remote()
    one, two = await compiled(Echo.remote()), await compiled(Echo.remote(), Echo.remote())
    server, unary = await grpc_echo()
    ways = {
        "Serve handle": lambda: handle.noop.remote(PAYLOAD),
        "Ray actor call": lambda: echo.noop.remote(PAYLOAD),
        "Serve replica's actor (__ray_call__)": lambda: replica.__ray_call__.remote(on_replica, PAYLOAD),
        "compiled graph, one actor": lambda: one(PAYLOAD),
        "compiled graph, 2 actors in a row": lambda: two(PAYLOAD),
        "gRPC unary, loopback": lambda: unary(PAYLOAD),
        "Serve replica's channel": lambda: channel.call(PAYLOAD),
    }
    results = {name: await timed(call, calls) for name, call in ways.items()}
    await server.stop(None)
    return results


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    ray.init(num_cpus=2, logging_level="WARNING", include_dashboard=False)
    try:
        results = asyncio.run(measure(calls))
    finally:
        ray.shutdown()
    print(f"{'transport':40} {'median ms':>9} {'p90 ms':>7}")
    for name, times in results.items():
        ms = sorted(1000 * t for t in times)
        print(f"{name:40} {statistics.median(ms):9.3f} {ms[int(0.9 * len(ms))]:7.3f}")


if __name__ == "__main__":
    main()
