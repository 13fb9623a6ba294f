"""The CPU a served request costs at the least, beyond its forwards: what any design serving it here pays, whatever its
orchestrator does. Each part runs alone, at 16 requests in flight, with nothing of ours in it:

- gRPC: a bare grpc.aio server streaming what a bench request gets (its headers, 2 chunks of 9 tokens, a Complete),
  called as `dlm bench --target` calls (a sync channel, a thread per stream): the server's CPU and the client's;
- the cache index: what a request writes at the least, through the orchestrator's own writer (its reservation, its
  record, a commit for each of 2 rounds, its release; batched 16 requests at a time as the writer batches them): this
  process's CPU (redis-py) and redis-server's;
- and one stream at a time, the bare server's way in and out: the time a call spends outside the server's handler,
  before it starts and after its last message, as `dlm bench --breakdown` counts a request's `way in and out`.

Against in process, a served token may cost at most (1 / ratio - 1) times the in-process CPU a token more for served
tok/s to reach `ratio` of in process, with the cores busy in both (`scripts/cpu_per_token.py` measures both).
`PYTHONPATH=. python scripts/serving_floor.py [REQUESTS]`"""

import asyncio
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import grpc
from cpu_per_token import stat_cpu  # this script's folder is on sys.path

from services.common.request import Request
from services.orchestrator.cluster.admission import Record, snapshot, whole
from services.orchestrator.cluster.index_writer import IndexWriter, Write
from services.serving.cache_index import IndexEntry, Op
from services.serving.redis_index import RedisCacheIndex
from services.serving.redis_process import redis_process

IN_FLIGHT = 16
SERVER = """
import asyncio, sys, time, grpc
async def generate(request, context):
    start = time.monotonic()
    await context.send_initial_metadata((("dlm-request-id", "r" * 32),))
    for _ in range(2):
        await asyncio.sleep(0.01)  # a round
        yield b"c" * 60
    yield b"%.6f %.6f " % (start, time.monotonic()) + b"k" * 130  # when it started and ended, CLOCK_MONOTONIC
async def main():
    server = grpc.aio.server()
    method = grpc.unary_stream_rpc_method_handler(generate)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.S", {"G": method}),))
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
"""


@contextmanager
def floor_server() -> Iterator[tuple[int, Callable[[], bytes]]]:
    """The bare server in a process of its own -> its pid, and a call of a stream as the bench's client calls it (it
    waits for the headers too, reconnect.holds) that returns its last message."""
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{int(server.stdout.readline())}") as channel:
            stream = channel.unary_stream("/floor.S/G")

            def call() -> bytes:
                messages = stream(b"p" * 120)
                messages.initial_metadata()
                return list(messages)[-1]

            yield server.pid, call
    finally:
        server.kill()
        server.wait()


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def grpc_floor(requests: int) -> tuple[float, float]:
    """-> (server, client) CPU ms a request."""
    with floor_server() as (pid, call), ThreadPoolExecutor(IN_FLIGHT) as pool:
        list(pool.map(lambda _: call(), range(4 * IN_FLIGHT)))  # warm up
        server_cpu, client_cpu = stat_cpu(f"/proc/{pid}/stat"), own_cpu()
        list(pool.map(lambda _: call(), range(requests)))
        server_cpu, client_cpu = stat_cpu(f"/proc/{pid}/stat") - server_cpu, own_cpu() - client_cpu
    return 1e3 * server_cpu / requests, 1e3 * client_cpu / requests


def grpc_way(calls: int) -> float:
    """One stream at a time: the median ms of a call outside the server's handler, before it started and after its
    last message (what `dlm bench --breakdown` counts as a request's way in and out)."""
    outside = []
    with floor_server() as (_, call):
        for _ in range(calls + 20):  # the first 20 warm up
            sent = time.monotonic()
            started, ended = map(float, call().split()[:2])
            outside.append(started - sent + time.monotonic() - ended)
    return 1e3 * statistics.median(outside[20:])


async def index_floor(requests: int) -> tuple[float, float]:
    """-> (this process, redis-server) CPU ms a request."""
    req = Request("r" * 32, list(range(30)), 48, 0, 1)  # a bench request's size
    req.order = list(range(9))
    blob = snapshot(req)
    with redis_process() as server:
        index = RedisCacheIndex.from_url(server.url)
        writer = IndexWriter(index, lambda changed: [], "floor", lease_s=3600)
        await writer.renew()

        async def wave(first: int) -> None:  # IN_FLIGHT requests, start to end
            rids = [f"req-{first + i}" for i in range(IN_FLIGHT)]
            for rid in rids:  # the reserver: one request at a time, in FIFO order
                await index.place(rid, [["d0", "d1"], ["g0"]], 78, 65536)
            for rid in rids:  # its record, with its reservation (IndexAdmission.placed)
                entry = IndexEntry(rid, "d0", "g0", snapshot=blob)
                writer.push(whole(Record(entry, 78, {"drafter": "d0", "guider": "g0"})))
            await writer.flush()
            for r in range(2):
                for rid in rids:
                    positions = list(range(9 * r, 9 * r + 9))
                    writer.push(Write(rid, [Op("commit", (rid, positions, positions, blob, 9 * r + 9))]))
                await writer.flush()
            for rid in rids:
                writer.push(Write(rid, [Op("release", (rid,))]))
            await writer.flush()

        await wave(-IN_FLIGHT)  # loads the scripts
        ours, theirs = own_cpu(), stat_cpu(f"/proc/{server.proc.pid}/stat")
        starts = range(0, requests, IN_FLIGHT)
        for first in starts:
            await wave(first)
        ours, theirs = own_cpu() - ours, stat_cpu(f"/proc/{server.proc.pid}/stat") - theirs
        await index.close()
    done = len(starts) * IN_FLIGHT
    return 1e3 * ours / done, 1e3 * theirs / done


def main(requests: int) -> None:
    start = time.perf_counter()
    server, client = grpc_floor(requests)
    ours, redis = asyncio.run(index_floor(requests))
    total = server + client + ours + redis
    print(f"{requests} requests, {IN_FLIGHT} in flight, CPU ms a request ({time.perf_counter() - start:.0f} s):")
    print(f"  gRPC server {server:.3f}, client {client:.3f}; index client {ours:.3f}, redis-server {redis:.3f}")
    print(f"  together {total:.3f}")
    print(f"one at a time, a stream's way in and out: {grpc_way(min(requests, 300)):.3f} ms (median)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
