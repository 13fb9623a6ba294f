"""The cache index: every test runs against the embedded index and against a real redis-server started here."""

import threading
import time
import uuid

import pytest

from services.serving.cache_index import EmbeddedCacheIndex, IndexEntry, Route
from services.serving.indexes import make_index

TTL = 0.3  # short TTL for expiry tests; waits are 2 * TTL


@pytest.fixture(params=["embedded", "redis"])
def index(request):
    if request.param == "embedded":
        yield EmbeddedCacheIndex(default_ttl_s=60, sweep_interval_s=0.05)
        return
    from services.serving.redis_index import RedisCacheIndex

    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    idx = RedisCacheIndex.from_url(request.getfixturevalue("redis_url"), prefix=prefix, default_ttl_s=60)
    yield idx
    for key in idx.client.scan_iter(match=prefix + "*"):
        idx.client.delete(key)
    idx.close()


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


def test_put_get_round_trips_every_field(index):
    entry = full_entry()
    index.put(entry)
    got = index.get("req-1")
    assert got == entry
    assert got.order == [3, 0, 1, 7, 2] and got.token_ids == [17, 0, 2**32 - 1, 42, 9]
    got.state["credits"].append(9.0)  # a copy: the index is not aliased
    got.order.append(99)
    assert index.get("req-1") == entry
    assert index.get("unknown") is None


def test_empty_entry_and_defaults(index):
    index.put(IndexEntry("bare"))
    got = index.get("bare")
    assert got == IndexEntry("bare", ttl_s=60.0)  # the index's default TTL is the one in force


def test_params_and_state_come_back_in_json_form(index):
    index.put(full_entry(params={"pair": (1, 2)}, state={1: "one"}))
    got = index.get("req-1")
    assert got.params == {"pair": [1, 2]} and got.state == {"1": "one"}
    with pytest.raises(TypeError):
        index.put(full_entry(state={"tensor": object()}))
    with pytest.raises(ValueError):
        index.put(full_entry(token_ids=[1, 2], order=[0]))
    with pytest.raises(ValueError):
        index.put(full_entry(token_ids=[-1], order=[0]))


def test_update_and_commit(index):
    index.put(full_entry(token_ids=[], order=[], committed_len=0))
    index.commit("req-1", positions=[2, 0], token_ids=[11, 12])
    index.commit("req-1", positions=[1], token_ids=[13])
    got = index.get("req-1")
    assert got.order == [2, 0, 1] and got.token_ids == [11, 12, 13] and got.committed_len == 3

    new = index.update("req-1", state={"credits": [1.0]}, strategy="slot", params={"slot_size": 32}, guider="g9")
    assert new == index.get("req-1")
    assert (new.state, new.strategy, new.params, new.guider) == ({"credits": [1.0]}, "slot", {"slot_size": 32}, "g9")
    assert new.order == [2, 0, 1] and new.drafter == "drafter-0" and new.ttl_s == 30.0

    new = index.update("req-1", token_ids=[5], order=[4], committed_len=1, ttl_s=None)
    assert (new.token_ids, new.order, new.committed_len, new.ttl_s) == ([5], [4], 1, 60.0)

    with pytest.raises(TypeError):
        index.update("req-1", request_id="other")
    with pytest.raises(ValueError):
        index.update("req-1", token_ids=[1])  # without its order
    with pytest.raises(ValueError):
        index.commit("req-1", positions=[1, 2], token_ids=[3])
    with pytest.raises(KeyError):
        index.update("missing", state={})
    with pytest.raises(KeyError):
        index.commit("missing", positions=[0], token_ids=[1])
    assert index.keys("missing") == []


def test_ttl_expiry(index):
    index.put(full_entry("short", ttl_s=TTL))
    index.put(full_entry("long", ttl_s=60))
    assert index.reserve("drafter-0", 100, budget=1000, request_id="short")
    assert index.reserve("drafter-0", 7, budget=1000, request_id="long")
    assert index.reserve("drafter-0", 5, budget=1000)  # anonymous: never expires
    assert index.replica_tokens("drafter-0") == 112
    if hasattr(index, "client"):  # redis: every key of the request carries the TTL
        assert all(0 < index.client.pttl(k) <= TTL * 1000 for k in index.keys("short"))
    time.sleep(2 * TTL)
    assert index.get("short") is None
    assert index.route("short") is None
    assert index.keys("short") == []
    assert index.replica_tokens("drafter-0") == 12  # its tokens went back with it
    assert index.holdings("drafter-0") == {"long": 7}
    assert not any("short" in k for k in index.storage_keys())
    assert index.get("long") is not None
    with pytest.raises(KeyError):
        index.commit("short", positions=[0], token_ids=[1])


def test_writes_refresh_the_ttl(index):
    index.put(full_entry("hb", ttl_s=2 * TTL))
    assert index.reserve("guider-1", 10, budget=None, request_id="hb")
    for _ in range(3):
        time.sleep(TTL)
        index.commit("hb", positions=[9], token_ids=[1])  # each write restarts the TTL
    assert index.get("hb").committed_len == 8
    assert index.replica_tokens("guider-1") == 10
    time.sleep(3 * TTL)
    assert index.get("hb") is None and index.replica_tokens("guider-1") == 0


def test_reservation_before_put_follows_the_entry_ttl(index):
    assert index.reserve("drafter-0", 40, budget=100, request_id="early")  # admission, no entry yet
    index.put(full_entry("early", ttl_s=TTL))
    time.sleep(2 * TTL)
    assert index.replica_tokens("drafter-0") == 0 and index.holdings("drafter-0") == {}


def test_release_removes_every_key(index):
    index.put(full_entry("gone"))
    index.put(full_entry("kept"))
    index.commit("gone", positions=[8], token_ids=[3])
    assert index.reserve("drafter-0", 30, budget=100, request_id="gone")
    assert index.reserve("guider-1", 20, budget=100, request_id="gone")
    assert index.reserve("drafter-0", 4, budget=100, request_id="kept")
    owned = index.keys("gone")
    assert len(owned) == 3 and all("gone" in k for k in owned)
    assert set(owned) <= set(index.storage_keys())

    assert index.release("gone")
    assert index.keys("gone") == []
    assert index.get("gone") is None and index.route("gone") is None
    assert not any("gone" in k for k in index.storage_keys())
    if hasattr(index, "client"):
        assert index.client.exists(*owned) == 0
    assert index.replica_tokens("drafter-0") == 4 and index.replica_tokens("guider-1") == 0
    assert index.holdings("drafter-0") == {"kept": 4} and index.holdings("guider-1") == {}
    assert index.get("kept") == full_entry("kept")
    assert not index.release("gone")


def test_reserve_respects_the_budget_under_concurrent_threads(index):
    budget, threads, attempts = 100, 8, 40
    granted = [0] * threads
    start = threading.Barrier(threads)

    def worker(i):
        start.wait()
        for _ in range(attempts):
            if index.reserve("drafter-0", 3, budget=budget, request_id=f"t{i}"):
                granted[i] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert sum(granted) == budget // 3  # 33 grants of 3 tokens, never 34
    assert index.replica_tokens("drafter-0") == 99
    held = index.holdings("drafter-0")
    assert sum(held.values()) == 99 and all(held.get(f"t{i}", 0) == 3 * granted[i] for i in range(threads))
    assert not index.reserve("drafter-0", 2, budget=budget)
    assert index.reserve("drafter-0", 1, budget=budget)


def test_replica_accounting(index):
    assert index.replica_tokens("r0") == 0 and index.holdings("r0") == {}
    assert index.reserve("r0", 50, budget=None, request_id="a")  # no budget: growth always admitted
    assert index.reserve("r0", 25, budget=80, request_id="a")
    assert not index.reserve("r0", 6, budget=80, request_id="b")
    assert index.reserve("r0", 5, budget=80, request_id="b")
    assert index.reserve("r1", 0, budget=0)
    assert index.holdings("r0") == {"a": 75, "b": 5}
    assert index.free("r0", 30, request_id="a") == 30  # the guider trimmed its cache
    assert index.free("r0", 100, request_id="b") == 5  # at most what b holds
    assert index.free("r0", 1, request_id="nobody") == 0
    assert index.holdings("r0") == {"a": 45} and index.replica_tokens("r0") == 45
    assert index.reserve("r0", 10, budget=None)  # anonymous
    assert index.free("r0", 4) == 4 and index.replica_tokens("r0") == 51
    assert index.release("a") and index.replica_tokens("r0") == 6
    assert index.free("r0", 100) == 6 and index.replica_tokens("r0") == 0
    assert index.replicas() == ["r0", "r1"]
    with pytest.raises(ValueError):
        index.reserve("r0", -1, budget=None)


def test_routing(index):
    index.put(full_entry("r"))
    assert index.route("r") == Route(drafter="drafter-0", guider="guider-1")
    drafter, guider = index.route("r")
    assert (drafter, guider) == ("drafter-0", "guider-1")
    index.update("r", drafter="drafter-3")  # migrated
    assert index.route("r") == Route("drafter-3", "guider-1")
    index.put(IndexEntry("no-guider", drafter="drafter-0"))
    assert index.route("no-guider") == Route("drafter-0", None)
    assert index.route("unknown") is None


def test_make_index_embedded():
    assert isinstance(make_index(None), EmbeddedCacheIndex)
    assert isinstance(make_index("", default_ttl_s=None), EmbeddedCacheIndex)
    assert isinstance(make_index("memory://"), EmbeddedCacheIndex)


def test_make_index_redis(redis_url):
    from services.serving.redis_index import RedisCacheIndex

    idx = make_index(redis_url, prefix=f"test:{uuid.uuid4().hex[:8]}:", default_ttl_s=5)
    try:
        assert isinstance(idx, RedisCacheIndex) and idx.default_ttl_s == 5
        idx.put(IndexEntry("x", drafter="d"))
        assert idx.route("x") == Route("d", None)
        assert idx.release("x")
    finally:
        idx.close()


# ids that spell another request's key under a `{p}req:{id}` + `:ids` scheme, or a glob
HOSTILE_IDS = ["x:ids", "x:order", "ids:x", "order:x", "req:x", "x:", ":x", "x*", "x\n", "x:ids:ids"]


def test_no_request_id_reaches_another_requests_keys(index):
    """A client's `x:ids` once turned x's ids key into a hash (WRONGTYPE on x's next commit) and releasing it
    deleted x's ids: every id must own keys of its own."""
    x = full_entry("x")
    index.put(x)
    owned = set(index.keys("x"))
    for rid in HOSTILE_IDS:
        index.put(full_entry(rid, token_ids=[1], order=[0], committed_len=1))
        index.commit(rid, positions=[1], token_ids=[2])
        index.update(rid, token_ids=[3], order=[0], state={"s": rid})
        assert not owned & set(index.keys(rid)), rid
        assert index.get("x") == x
        assert index.release(rid)
        assert index.get("x") == x and set(index.keys("x")) == owned
    index.commit("x", positions=[5], token_ids=[6])  # x's keys kept their types
    assert index.get("x").token_ids == x.token_ids + [6]


def test_redis_password_from_the_environment(monkeypatch):
    """DLM_REDIS_PASSWORD authenticates the index, so the URL in the config carries no password."""
    from tests.redis_server import find_redis_server, redis_server

    redis = pytest.importorskip("redis")
    binary = find_redis_server()
    if binary is None:
        pytest.skip("redis-server not found")
    with redis_server(binary, password="pw-from-env") as url:
        monkeypatch.delenv("DLM_REDIS_PASSWORD", raising=False)
        refused = make_index(url)
        with pytest.raises(redis.AuthenticationError):
            refused.get("r")
        refused.close()
        monkeypatch.setenv("DLM_REDIS_PASSWORD", "pw-from-env")
        index = make_index(url)
        index.put(IndexEntry("r"))
        assert index.get("r").request_id == "r"
        index.close()
