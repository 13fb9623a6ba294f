"""The cache index on a real redis-server started here."""

import asyncio
import uuid

import pytest

from services.serving.cache_index import IndexEntry, IndexUnavailable, Op, OwnerAlive, request_keys
from services.serving.indexes import make_index
from services.serving.redis_index import RedisCacheIndex

TTL = 0.3  # short TTL for expiry tests; waits are 2 * TTL

pytestmark = pytest.mark.anyio


@pytest.fixture
async def index(redis_url):
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    idx = RedisCacheIndex.from_url(redis_url, prefix=prefix, default_ttl_s=60)
    yield idx
    async for key in idx.client.scan_iter(match=prefix + "*"):
        await idx.client.delete(key)
    await idx.close()


def full_entry(rid: str = "req-1", **overrides) -> IndexEntry:
    values = dict(
        request_id=rid,
        drafter="drafter-0",
        guider="guider-1",
        committed_len=5,
        token_ids=[17, 0, 2**32 - 1, 42, 9],
        order=[3, 0, 1, 7, 2],  # out of logical order: slots committed ahead of the frontier
        strategy="pipeline",
        params={"window": 16, "top_k_match": 2, "guidance_threshold": 0.5, "bonus_token": True},
        state={"credits": [0.25, 1.5, -3.0], "slots": {"4": [5, 6]}, "phase": None, "done": False},
        ttl_s=30.0,
    )
    values.update(overrides)
    return IndexEntry(**values)


async def stored_keys(index: RedisCacheIndex, request_id: str) -> set[str]:
    """The request's keys (entry, ids, order) that the index stores now."""
    return set(request_keys(index.prefix, request_id)) & set(await index.storage_keys())


async def test_put_get_round_trips_every_field(index):
    entry = full_entry()
    await index.put(entry)
    got = await index.get("req-1")
    assert got == entry
    assert got.order == [3, 0, 1, 7, 2] and got.token_ids == [17, 0, 2**32 - 1, 42, 9]
    got.state["credits"].append(9.0)  # a copy: the index is not aliased
    got.order.append(99)
    assert await index.get("req-1") == entry
    assert await index.get("unknown") is None


async def test_empty_entry_and_defaults(index):
    await index.put(IndexEntry("bare"))
    got = await index.get("bare")
    assert got == IndexEntry("bare", ttl_s=60.0)  # the index's default TTL is the one in force


async def test_params_and_state_come_back_in_json_form(index):
    await index.put(full_entry(params={"pair": (1, 2)}, state={1: "one"}))
    got = await index.get("req-1")
    assert got.params == {"pair": [1, 2]} and got.state == {"1": "one"}
    with pytest.raises(TypeError):
        await index.put(full_entry(state={"tensor": object()}))
    with pytest.raises(ValueError):
        await index.put(full_entry(token_ids=[1, 2], order=[0]))
    with pytest.raises(ValueError):
        await index.put(full_entry(token_ids=[-1], order=[0]))


async def test_commit_appends_in_commit_order(index):
    await index.put(full_entry(token_ids=[], order=[], committed_len=0))
    await index.commit("req-1", positions=[2, 0], token_ids=[11, 12])
    await index.commit("req-1", positions=[1], token_ids=[13])
    got = await index.get("req-1")
    assert got.order == [2, 0, 1] and got.token_ids == [11, 12, 13] and got.committed_len == 3
    assert got == full_entry(token_ids=[11, 12, 13], order=[2, 0, 1], committed_len=3)  # the rest as put

    with pytest.raises(ValueError):
        await index.commit("req-1", positions=[1, 2], token_ids=[3])
    with pytest.raises(KeyError):
        await index.commit("missing", positions=[0], token_ids=[1])
    assert await stored_keys(index, "missing") == set()  # a commit to no entry makes none


async def test_ttl_expiry(index):
    await index.put(full_entry("short", ttl_s=TTL))
    await index.put(full_entry("long", ttl_s=60))
    assert await index.place("short", [["drafter-0"]], 100, budget=1000) == ["drafter-0"]
    assert await index.place("long", [["drafter-0"]], 7, budget=1000) == ["drafter-0"]
    assert await index.replica_tokens("drafter-0") == 107
    owned = await stored_keys(index, "short")
    assert len(owned) == 3 and all([0 < await index.client.pttl(k) <= TTL * 1000 for k in owned])  # every key's TTL
    await asyncio.sleep(2 * TTL)
    assert await index.get("short") is None
    assert await stored_keys(index, "short") == set()
    assert await index.replica_tokens("drafter-0") == 7  # its tokens went back with it
    assert await index.holdings("drafter-0") == {"long": 7}
    assert not any("short" in k for k in await index.storage_keys())
    assert await index.get("long") is not None
    with pytest.raises(KeyError):
        await index.commit("short", positions=[0], token_ids=[1])


async def test_writes_refresh_the_ttl(index):
    await index.put(full_entry("hb", ttl_s=2 * TTL))
    assert await index.place("hb", [["guider-1"]], 10, budget=None) == ["guider-1"]
    for _ in range(3):
        await asyncio.sleep(TTL)
        await index.commit("hb", positions=[9], token_ids=[1])  # each write restarts the TTL
    assert (await index.get("hb")).committed_len == 8
    assert await index.replica_tokens("guider-1") == 10
    await asyncio.sleep(3 * TTL)
    assert await index.get("hb") is None and await index.replica_tokens("guider-1") == 0


async def test_reservation_before_put_follows_the_entry_ttl(index):
    assert await index.place("early", [["drafter-0"]], 40, budget=100) == ["drafter-0"]  # admission, no entry yet
    await index.put(full_entry("early", ttl_s=TTL))
    await asyncio.sleep(2 * TTL)
    assert await index.replica_tokens("drafter-0") == 0 and await index.holdings("drafter-0") == {}


async def test_release_removes_every_key(index):
    await index.put(full_entry("gone"))
    await index.put(full_entry("kept"))
    await index.commit("gone", positions=[8], token_ids=[3])
    assert await index.place("gone", [["drafter-0"], ["guider-1"]], 30, budget=100) == ["drafter-0", "guider-1"]
    assert await index.place("kept", [["drafter-0"]], 4, budget=100) == ["drafter-0"]
    owned = await stored_keys(index, "gone")
    assert len(owned) == 3

    assert await index.release("gone")
    assert await index.get("gone") is None
    assert not any("gone" in k for k in await index.storage_keys())
    assert await index.client.exists(*owned) == 0
    assert await index.replica_tokens("drafter-0") == 4 and await index.replica_tokens("guider-1") == 0
    assert await index.holdings("drafter-0") == {"kept": 4} and await index.holdings("guider-1") == {}
    assert await index.get("kept") == full_entry("kept")
    assert not await index.release("gone")


async def test_place_is_all_or_nothing_on_the_freest_candidates(index):
    drafters, guiders = ["d0", "d1"], ["g0"]
    assert await index.place("a", [drafters, guiders], 40, budget=100) == ["d0", "g0"]
    assert await index.place("b", [drafters, guiders], 30, budget=100) == ["d1", "g0"]
    assert await index.place("c", [drafters, guiders], 40, budget=100) is None  # g0 holds 70: d1 is not charged
    assert await index.holdings("d1") == {"b": 30} and await index.replica_tokens("g0") == 70
    assert await index.place("c", [drafters, guiders], 30, budget=100) == ["d1", "g0"]
    # what a request holds counts as its room: c moves to d0 although g0 is full (100), its own 30 among them
    assert await index.place("c", [["d0"], guiders], 30, budget=100) == ["d0", "g0"]
    assert await index.holdings("d0") == {"a": 40, "c": 30} and await index.holdings("d1") == {"b": 30}
    assert await index.place("d", [["d1"], guiders], 1, budget=100) is None  # g0 is full
    assert await index.place("d", [["d1"], guiders], 1, budget=None) == ["d1", "g0"]  # a move: no budget
    assert await index.replica_tokens("g0") == 101
    assert await index.release("c")
    assert await index.replica_tokens("d0") == 40 and await index.replica_tokens("g0") == 71


async def test_place_never_overcommits_under_concurrent_orchestrators(index):
    async def admit(i: int) -> list[str] | None:
        return await index.place(f"r{i}", [["d0", "d1"], ["g0"]], 7, budget=50)

    placed = [p for p in await asyncio.gather(*(admit(i) for i in range(32))) if p]
    assert len(placed) == 7  # g0: 7 requests of 7 tokens, never 8
    assert await index.replica_tokens("g0") == 49
    assert await index.replica_tokens("d0") + await index.replica_tokens("d1") == 49


async def test_replica_accounting(index):
    assert await index.replica_tokens("r0") == 0 and await index.holdings("r0") == {}
    assert await index.place("a", [["r0"]], 75, budget=None) == ["r0"]  # no budget: growth always admitted
    assert await index.place("b", [["r0"]], 6, budget=80) is None
    assert await index.place("b", [["r0"]], 5, budget=80) == ["r0"]
    assert await index.place("c", [["r1"]], 0, budget=0) == ["r1"]
    assert await index.holdings("r0") == {"a": 75, "b": 5}
    assert await index.place("a", [["r0"]], 45, budget=80) == ["r0"]  # the guider trimmed its cache
    assert await index.holdings("r0") == {"a": 45, "b": 5} and await index.replica_tokens("r0") == 50
    assert await index.release("b") and await index.replica_tokens("r0") == 45
    assert await index.replicas() == ["r0", "r1"]
    assert await index.release("a") and await index.replica_tokens("r0") == 0
    assert await index.replicas() == ["r1"]  # r0 holds nothing now, so it left the index (c still holds r1)
    with pytest.raises(ValueError):
        await index.place("a", [["r0"]], -1, budget=None)


def test_the_index_needs_a_redis_url():
    for url in (None, ""):
        with pytest.raises(ValueError, match="serving.redis_url is not set"):
            make_index(url)


async def test_make_index_redis(redis_url):
    idx = make_index(redis_url, prefix=f"test:{uuid.uuid4().hex[:8]}:", default_ttl_s=5)
    try:
        assert isinstance(idx, RedisCacheIndex) and idx.default_ttl_s == 5
        await idx.put(IndexEntry("x", drafter="d"))
        assert (await idx.get("x")).drafter == "d"
        assert await idx.release("x")
    finally:
        await idx.close()


async def test_unreachable_redis_raises_index_unavailable():
    from tests.redis_server import free_port

    port = free_port()  # nothing listens there
    idx = make_index(f"redis://127.0.0.1:{port}/0")
    try:
        assert str(idx) == f"Redis at 127.0.0.1:{port}"
        with pytest.raises(IndexUnavailable):
            await idx.get("x")
        with pytest.raises(IndexUnavailable):
            await idx.put(IndexEntry("x", drafter="d"))
    finally:
        await idx.close()


# ids that spell another request's key under a `{p}req:{id}` + `:ids` scheme, or a glob
HOSTILE_IDS = ["x:ids", "x:order", "ids:x", "order:x", "req:x", "x:", ":x", "x*", "x\n", "x:ids:ids"]


async def test_no_request_id_reaches_another_requests_keys(index):
    """A client's `x:ids` once turned x's ids key into a hash (WRONGTYPE on x's next commit) and releasing it
    deleted x's ids: every id must own keys of its own."""
    x = full_entry("x")
    await index.put(x)
    owned = await stored_keys(index, "x")
    assert len(owned) == 3
    for rid in HOSTILE_IDS:
        await index.put(full_entry(rid, token_ids=[1], order=[0], committed_len=1))
        await index.commit(rid, positions=[1], token_ids=[2])
        await index.adopt(rid, "orch-a")
        assert not owned & await stored_keys(index, rid), rid
        assert await index.get("x") == x
        assert await index.release(rid)
        assert await index.get("x") == x and await stored_keys(index, "x") == owned
    await index.commit("x", positions=[5], token_ids=[6])  # x's keys kept their types
    assert (await index.get("x")).token_ids == x.token_ids + [6]


async def test_redis_password_from_the_environment(monkeypatch):
    """DLM_REDIS_PASSWORD authenticates the index, so the URL in the config carries no password."""
    from tests.redis_server import find_redis_server, redis_process

    pytest.importorskip("redis")
    binary = find_redis_server()
    if binary is None:
        pytest.skip("redis-server not found")
    with redis_process(binary, password="pw-from-env") as server:
        url = server.url
        monkeypatch.delenv("DLM_REDIS_PASSWORD", raising=False)
        refused = make_index(url)
        with pytest.raises(IndexUnavailable, match="authenticat"):
            await refused.get("r")
        await refused.close()
        monkeypatch.setenv("DLM_REDIS_PASSWORD", "pw-from-env")
        index = make_index(url)
        await index.put(IndexEntry("r"))
        assert (await index.get("r")).request_id == "r"
        await index.close()


async def test_no_key_outlives_the_last_request(index):
    """After every request is released, the index holds nothing: not even its replicas' counters."""
    await index.put(full_entry("a"))
    assert await index.place("a", [["r0"], ["r1"]], 10, budget=100) == ["r0", "r1"]
    await index.release("a")
    assert await index.storage_keys() == [] and await index.replicas() == []


async def test_a_record_whose_owner_is_alive_is_never_adopted(index):
    """Takeover: another orchestrator adopts a request only once its owner's lease expired; then it owns it, and the
    old owner, back, cannot take it again while the new owner's lease lives."""
    await index.put(full_entry("r", owner="orch-a", snapshot=b"round-3"))
    await index.lease("orch-a", ttl_s=TTL)
    with pytest.raises(OwnerAlive, match="orch-a"):
        await index.adopt("r", "orch-b")
    assert (await index.get("r")).owner == "orch-a"
    assert (await index.adopt("r", "orch-a")).owner == "orch-a"  # its owner may take it back (a reconnect)
    await asyncio.sleep(2 * TTL)  # orch-a stopped renewing its lease
    assert "orch-a" not in await index.leases()
    await index.lease("orch-b", ttl_s=60, address="10.0.0.2:7001")
    adopted = await index.adopt("r", "orch-b")
    assert adopted.owner == "orch-b" and adopted.snapshot == b"round-3"
    await index.lease("orch-a", ttl_s=60)
    with pytest.raises(OwnerAlive, match="orch-b") as alive:
        await index.adopt("r", "orch-a")
    assert (alive.value.owner, alive.value.address) == ("orch-b", "10.0.0.2:7001")  # where to relay its stream from
    assert await index.adopt("unknown", "orch-b") is None
    assert set(await index.leases()) == {"orch-a", "orch-b"}


async def test_a_round_commits_its_tokens_snapshot_and_streamed_count_together(index):
    await index.put(full_entry("r", token_ids=[], order=[], committed_len=0, snapshot=b"round-0"))
    await index.commit("r", positions=[1, 0], token_ids=[7, 8], snapshot=b"round-1", streamed=2)
    got = await index.get("r")
    assert (got.order, got.token_ids, got.snapshot, got.streamed) == ([1, 0], [7, 8], b"round-1", 2)
    await index.commit("r", positions=[2], token_ids=[9])  # without a snapshot: the last one stays
    got = await index.get("r")
    assert (got.order, got.snapshot, got.streamed) == ([1, 0, 2], b"round-1", 2)


async def test_a_batch_runs_its_operations_in_order_in_one_round_trip(index, round_trips):
    """Each operation as its method alone would, its result or its error in its place, none stopping the next."""
    assert await index.batch([Op("put", (full_entry("ended"),))]) == [None]  # the first loads the scripts
    sent = round_trips[0]
    results = await index.batch(
        [
            Op("put", (full_entry("r", token_ids=[], order=[], committed_len=0),)),
            Op("commit", ("r", [2], [11])),
            Op("commit", ("gone", [0], [1])),  # no entry
            Op("commit", ("r", [0, 1], [12])),  # misaligned: never sent
            Op("get", ("r",)),  # a read: not for a batch
            Op("commit", ("r", [0, 1], [12, 13], b"round-2", 3)),
            Op("place", ("r", [["drafter-0", "drafter-1"]], 30, 100)),
            Op("release", ("ended",)),
            Op("release", ("ended",)),
        ]
    )
    assert round_trips[0] == sent + 1
    assert results[:2] == [None, None] and results[5:] == [None, ["drafter-0"], True, False]
    assert isinstance(results[2], KeyError) and isinstance(results[3], ValueError)
    assert isinstance(results[4], ValueError) and "'get'" in str(results[4])
    got = await index.get("r")
    assert (got.order, got.token_ids, got.committed_len) == ([2, 0, 1], [11, 12, 13], 3)
    assert (got.snapshot, got.streamed) == (b"round-2", 3)
    assert await index.holdings("drafter-0") == {"r": 30} and await index.get("ended") is None
    assert await stored_keys(index, "gone") == set()


async def test_a_batch_after_redis_lost_its_scripts_is_unavailable_once(index):
    """A pipeline cannot load a lost script and go on in order: the batch says the index restarted (its writes may
    or may not have happened), and the next one goes through."""
    assert await index.batch([Op("put", (full_entry("r", token_ids=[], order=[], committed_len=0),))]) == [None]
    await index.client.script_flush()  # what a restart does to them
    with pytest.raises(IndexUnavailable, match="lost its scripts"):
        await index.batch([Op("commit", ("r", [0], [5])), Op("release", ("other",))])
    assert await index.batch([Op("commit", ("r", [1], [6])), Op("release", ("other",))]) == [None, False]
    assert (await index.get("r")).order == [1]


async def test_orphans_are_the_records_whose_owner_lease_lapsed(index):
    """The sweep's list: a record whose owner's lease lives is not an orphan; once it lapses it is, until a live
    orchestrator adopts it; released records are not."""
    await index.put(full_entry("kept", owner="orch-a"))
    await index.put(full_entry("lost:*", owner="orch-b"))  # a glob character in the id
    await index.put(full_entry("ended", owner="orch-b"))
    await index.release("ended")
    await index.lease("orch-a", ttl_s=60)
    await index.lease("orch-b", ttl_s=TTL)
    assert await index.orphans() == []
    await asyncio.sleep(2 * TTL)
    assert await index.orphans() == ["lost:*"]
    await index.adopt("lost:*", "orch-a")
    assert await index.orphans() == []
