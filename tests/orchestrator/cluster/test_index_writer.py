"""The index writer's batches: every write queued goes in one round trip, in order, and none is lost when a batch
meets an entry that is gone (KeyError) or an index that cannot be reached (IndexUnavailable) halfway."""

import asyncio
import logging
import uuid

import pytest

from services.orchestrator.cluster.index_writer import IndexWriter, Write
from services.serving.cache_index import IndexEntry, IndexUnavailable, Op, request_keys
from services.serving.redis_index import RedisCacheIndex

pytestmark = pytest.mark.anyio

TOKENS = 10  # each request's reservation on d0


@pytest.fixture
async def index(redis_url):
    idx = RedisCacheIndex.from_url(redis_url, prefix=f"test:{uuid.uuid4().hex[:8]}:")
    yield idx
    for key in await idx.storage_keys():
        await idx.client.delete(key)
    await idx.close()


def whole(entry: IndexEntry) -> Write:
    rid = entry.request_id
    return Write(rid, [Op("put", (entry,)), Op("place", (rid, [["d0"]], TOKENS, None))])


def commit(rid: str, positions: list[int], ids: list[int]) -> Write:
    return Write(rid, [Op("commit", (rid, positions, ids))])


def release(rid: str, landed=None) -> Write:
    return Write(rid, [Op("release", (rid,))], landed)


def nothing_lost(changed: set[str]) -> list[Write]:
    raise AssertionError(f"restore({changed}): the index lost nothing")


class Copy:
    """What an admission keeps for the writer's restore: the live requests' entries, written whole again, and a
    release for each changed request that ended."""

    def __init__(self, *live: IndexEntry):
        self.live = {entry.request_id: entry for entry in live}
        self.changed: list[set[str]] = []  # what each restore was given

    def restore(self, changed: set[str]) -> list[Write]:
        self.changed.append(set(changed))
        return [release(rid) for rid in sorted(changed) if rid not in self.live] + [*map(whole, self.live.values())]


class InFlight:
    """The index, but while its next batch is on its way `during` runs (the step goes on and queues more writes),
    and with `cut` that batch loses the connection after its first `cut` operations ran."""

    def __init__(self, inner: RedisCacheIndex):
        self.inner, self.during, self.cut = inner, lambda: None, None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def batch(self, ops: list[Op]) -> list[object]:
        during, self.during = self.during, lambda: None
        during()
        if self.cut is None:
            return await self.inner.batch(ops)
        cut, self.cut = self.cut, None
        await self.inner.batch(ops[:cut])
        raise IndexUnavailable("cache index (Redis at test) unavailable: Connection lost")


async def records(index: RedisCacheIndex) -> dict[str, tuple]:
    """Each request with an entry: its strategy, commits (order, token ids) and tokens held on d0."""
    held, out = await index.holdings("d0"), {}
    for rid in await index.requests():
        entry = await index.get(rid)
        out[rid] = (entry.strategy, entry.order, entry.token_ids, held.pop(rid, None))
    return {**out, **{rid: (None, None, None, tokens) for rid, tokens in held.items()}}


async def test_a_flush_applies_every_queued_write_in_order_in_one_round_trip(index, round_trips, caplog):
    """16 requests' commits of two rounds, a bad write among them, releases and writes whole of the same requests:
    one round trip, the index as if they went one by one, the bad one dropped with a log, each release landed
    before the reserver hears of it."""
    rids = [f"r{i}" for i in range(16)]
    writer = IndexWriter(index, nothing_lost, "orchestrator-test", lease_s=60)
    await writer.renew()
    for rid in rids:
        writer.push(whole(IndexEntry(rid)))
    await writer.flush()
    sent, landed = round_trips[0], []
    for rid in rids:
        writer.push(commit(rid, [2], [12]))
    writer.push(commit("r0", [0, 1], [10]))  # misaligned
    for rid in rids:
        writer.push(commit(rid, [0, 1], [10, 11]))
    writer.push(whole(IndexEntry("r2", strategy="replaced")))
    writer.push(release("r2", lambda: landed.append("r2")))
    writer.push(release("r1", lambda: landed.append("r1")))
    writer.push(whole(IndexEntry("r1", strategy="again")))
    with caplog.at_level(logging.ERROR):
        await writer.flush()
    assert round_trips[0] == sent + 1
    assert not writer.queue and landed == ["r2", "r1"]
    assert [r.getMessage() for r in caplog.records] == ["cache index write for r0 failed"]
    want = dict.fromkeys(rids, ("", [2, 0, 1], [12, 10, 11], TOKENS))
    want["r1"] = ("again", [], [], TOKENS)
    del want["r2"]
    assert await records(index) == want


async def test_an_entry_gone_mid_batch_rewrites_every_request_from_it_on(index):
    """A commit in the middle of a batch finds its entry gone: the writes after it in the batch ran, but every
    request they and the writes queued meanwhile touched is restored, the ended ones released."""
    copy = Copy(IndexEntry("a", order=[0], token_ids=[6]), IndexEntry("b", order=[0, 1], token_ids=[5, 7]))
    flight = InFlight(index)
    writer = IndexWriter(flight, copy.restore, "orchestrator-test", lease_s=60)
    await writer.renew()
    for rid in "abcd":
        writer.push(whole(IndexEntry(rid)))
    await writer.flush()
    await index.client.delete(*request_keys(index.prefix, "a"))  # lost, as by a restart
    flight.during = lambda: writer.push(release("d"))
    for write in (commit("b", [0], [5]), commit("a", [0], [6]), commit("b", [1], [7]), release("c")):
        writer.push(write)
    await writer.flush()
    assert len(copy.changed) == 1 and copy.changed[0] >= {"a", "b", "c", "d"}
    assert not writer.queue and writer.down is None
    assert await records(index) == {"a": ("", [0], [6], TOKENS), "b": ("", [0, 1], [5, 7], TOKENS)}


async def test_an_index_lost_mid_batch_loses_no_write(index):
    """The connection drops after a batch's first operations ran: the writer remembers every request of the batch
    and those queued meanwhile, and once the index answers writes them whole again and releases the ended ones."""
    copy = Copy(IndexEntry("a", order=[0], token_ids=[6]), IndexEntry("b", order=[0, 1], token_ids=[5, 7]))
    flight = InFlight(index)
    writer = IndexWriter(flight, copy.restore, "orchestrator-test", lease_s=60)
    await writer.start()
    try:
        for rid in "abcd":
            writer.push(whole(IndexEntry(rid)))
        await settled(writer, lambda: True)
        flight.cut, flight.during = 2, lambda: writer.push(release("d"))
        for write in (commit("a", [0], [6]), commit("b", [0], [5]), release("c"), commit("b", [1], [7])):
            writer.push(write)
        await settled(writer, lambda: copy.changed)
    finally:
        await writer.stop()
    assert copy.changed == [{"a", "b", "c", "d"}]
    assert await records(index) == {"a": ("", [0], [6], TOKENS), "b": ("", [0, 1], [5, 7], TOKENS)}


async def settled(writer: IndexWriter, done) -> None:
    for _ in range(300):
        if done() and writer.down is None and not writer.queue:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"writer never settled: {writer.down}, {writer.queue}")
