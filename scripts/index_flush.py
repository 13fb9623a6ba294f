"""What one round's index writes cost an orchestrator at 16 streams: 16 commits, each with its request's snapshot,
one round trip each (the writer before its batches) against `IndexWriter.flush`, one batch. On a redis-server of its
own on loopback; round trips counted at the client's socket, times best and median of REPEATS, wall and this
process's CPU. `PYTHONPATH=. python scripts/index_flush.py [STREAMS]`"""

import asyncio
import statistics
import sys
import time

from redis.asyncio.connection import AbstractConnection

from services.common.request import Request
from services.orchestrator.cluster.admission import snapshot
from services.orchestrator.cluster.index_writer import IndexWriter, Write
from services.serving.cache_index import IndexEntry, Op
from services.serving.redis_index import RedisCacheIndex
from services.serving.redis_process import redis_process

REPEATS = 200
sent = [0]


def count_sends() -> None:
    send = AbstractConnection.send_packed_command

    async def counted(self, *args, **kwargs):
        sent[0] += 1
        return await send(self, *args, **kwargs)

    AbstractConnection.send_packed_command = counted


def commits(rids: list[str], blob: bytes, round_: int) -> list[Op]:
    return [Op("commit", (rid, [round_], [round_ % 1000], blob, round_)) for rid in rids]


async def one_by_one(index: RedisCacheIndex, ops: list[Op]) -> None:
    for op in ops:
        await index.commit(*op.args)


async def batched(writer: IndexWriter, ops: list[Op]) -> None:
    for op in ops:
        writer.push(Write(op.args[0], [op]))
    await writer.flush()


async def measure(name: str, run, streams: int) -> None:
    walls, cpus, trips = [], [], []
    for round_ in range(REPEATS):
        before, wall, cpu = sent[0], time.perf_counter(), time.process_time()
        await run(round_)
        walls.append(1e3 * (time.perf_counter() - wall))
        cpus.append(1e3 * (time.process_time() - cpu))
        trips.append(sent[0] - before)
    wall, cpu = (f"{min(ms):.2f} / {statistics.median(ms):.2f} ms" for ms in (walls, cpus))
    print(f"{name:10} {streams} commits: {statistics.median(trips):.0f} round trips, wall {wall}, cpu {cpu}")


async def main(streams: int) -> None:
    req = Request("r" * 36, list(range(30)), 48, 0, 1)  # a bench request
    req.order = list(range(24))
    blob = snapshot(req)
    with redis_process() as server:
        index = RedisCacheIndex.from_url(server.url)
        rids = [f"req-{i}" for i in range(streams)]
        for rid in rids:
            await index.put(IndexEntry(rid, drafter="d0", guider="g0", snapshot=blob))
        writer = IndexWriter(index, lambda changed: [], "bench", lease_s=3600)
        await writer.renew()
        await batched(writer, commits(rids, blob, 0))  # loads the scripts
        count_sends()
        print(f"snapshot {len(blob)} bytes")
        for _ in range(2):  # alternating, so that neither has the quieter machine
            await measure("one by one", lambda r: one_by_one(index, commits(rids, blob, r)), streams)
            await measure("one batch", lambda r: batched(writer, commits(rids, blob, r)), streams)
        await index.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 16))
