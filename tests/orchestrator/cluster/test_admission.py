"""KV admission: the scheduler's queue in front of each replica's budget, and an index kept round by round, through
the index being down and coming back."""

import asyncio
import uuid

import pytest

from services.common.placement import Placement
from services.orchestrator.cluster.admission import IndexAdmission
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.scheduler import ResourceExhausted, Unavailable
from services.serving.cache_index import CacheIndex, IndexUnavailable, request_keys
from services.serving.redis_index import RedisCacheIndex
from tests.orchestrator.cluster.test_takeover import halt


@pytest.fixture
def index(redis_url):
    """An index of its own on the suite's redis-server (a prefix per test)."""
    return RedisCacheIndex.from_url(redis_url, prefix=f"test:{uuid.uuid4().hex[:8]}:")


pytestmark = pytest.mark.anyio


ONE_EACH = {"drafter": ["d0"], "guider": ["g0"]}  # deployment -> its live replicas


def engine_with(
    engine, index: CacheIndex, budget: int, max_queue: int = 4, live=ONE_EACH, owner: str = "orchestrator-test"
) -> Engine:
    placement = Placement(("drafter", "guider"), lambda deployment: live[deployment], budget)
    admission = IndexAdmission(index, placement, ttl_s=60, owner=owner, lease_s=0.15)
    config = engine.config
    serving = type(config.serving)(kv_budget_tokens=budget, max_queue=max_queue)
    return Engine(type(config)(models=config.models, serving=serving), executor=engine.executor, admission=admission)


@pytest.fixture
async def started(engine):
    """Engines with their admission's tasks running; every request they hold is cancelled and the tasks stopped at
    the end."""
    engines = []

    async def start(index: CacheIndex, budget: int, max_queue: int = 4, **kwargs) -> Engine:
        engines.append(engine_with(engine, index, budget, max_queue, **kwargs))
        await engines[-1].scheduler.admission.start(lambda: None)
        return engines[-1]

    yield start
    for eng in engines:
        eng.cancel([er.req for er in eng.requests.values()])
        admission = eng.scheduler.admission
        if not admission.writer.task.done():  # not killed
            await admission.stop()


async def steps_until(eng: Engine, done, outputs: list | None = None) -> None:
    """Step (waiting for the reserver between steps) until done()."""
    for _ in range(500):
        await eng.step_async((outputs if outputs is not None else []).append)
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never done")


def running(eng: Engine) -> list[str]:
    return [er.req.id for er in eng.scheduler.running]


async def mirrored(eng: Engine) -> CacheIndex:
    """The index once the admission's writes reached it."""
    await settled(eng.scheduler.admission, down=False)
    return eng.scheduler.admission.writer.index


async def test_queue_then_refuse_then_admit_on_release(started, index):
    eng = await started(index, budget=60, max_queue=1)
    first = eng.add_request("count from 1 to 9:", "streaming", max_new_tokens=40)
    await steps_until(eng, lambda: running(eng) == [first.id])
    assert await (await mirrored(eng)).replica_tokens("d0") == first.prompt_len + 40
    second = eng.add_request("copy: the lazy dog", "streaming", max_new_tokens=40)
    for _ in range(3):
        await asyncio.sleep(0.05)
        await eng.step_async(print)
    assert [s.req.id for s in eng.scheduler.waiting] == [second.id]  # no room: it waits
    with pytest.raises(ResourceExhausted, match="waiting"):
        eng.add_request("def add(a, b):", "streaming", max_new_tokens=40)
    eng.abort(first.id)
    await steps_until(eng, lambda: running(eng) == [second.id])  # first's tokens freed in the index admit second
    index = await mirrored(eng)
    assert await index.get(first.id) is None and await index.get(second.id) is not None
    assert await index.holdings("d0") == {second.id: second.prompt_len + 40}


async def test_request_larger_than_budget_is_refused(engine, index):
    with pytest.raises(ResourceExhausted, match="budget"):
        engine_with(engine, index, budget=10).add_request("count from 1 to 9:", "streaming", max_new_tokens=40)


async def test_index_records_commits_and_forgets_the_request(started, index):
    eng = await started(index, budget=1000)
    req = eng.add_request("count from 1 to 9:", "slot", {"slot_size": 4, "block_size": 8}, max_new_tokens=12)
    await steps_until(eng, lambda: req.stats.rounds >= 2)
    entry = await (await mirrored(eng)).get(req.id)
    assert entry.order == req.order and entry.token_ids == req.tokens[req.order].tolist()
    assert entry.committed_len == len(req.order)
    assert entry.strategy == "slot" and entry.drafter == "d0"
    eng.cancel([req])  # a cancelled request: everything goes
    index = await mirrored(eng)
    assert not set(request_keys(index.prefix, req.id)) & set(await index.storage_keys())
    assert await index.replica_tokens("d0") == 0
    assert all(req.id not in host.kv.caches for host in eng.executor.hosts.values() if hasattr(host, "kv"))


async def test_a_moved_request_is_recorded_on_its_new_replica(started, index):
    eng = await started(index, budget=100)
    req = eng.add_request("count from 1 to 9:", "streaming", max_new_tokens=40)
    await steps_until(eng, lambda: running(eng) == [req.id])
    placement, tokens = eng.scheduler.admission.placement, req.prompt_len + 40
    placement.live = {"drafter": ["d0"], "guider": ["g0", "g1"]}.__getitem__
    placement.move(req.id, "guider", gone={"g0"})  # what the remote hosts do when g0 is lost
    await eng.step_async(print)  # the round's progress follows it
    index = await mirrored(eng)
    entry = await index.get(req.id)
    assert (entry.drafter, entry.guider) == ("d0", "g1")
    assert await index.holdings("g0") == {} and await index.holdings("g1") == {req.id: tokens}
    assert entry.order == req.order  # its commits went along
    assert placement.used == {"d0": tokens, "g0": 0, "g1": tokens}


async def test_waiting_request_past_its_deadline_ends_without_running(started, index):
    eng = await started(index, budget=60)
    first = eng.add_request("count from 1 to 9:", "streaming", max_new_tokens=40)
    late = eng.request("copy: the lazy dog", max_new_tokens=40)
    eng.add(late, "streaming", deadline=0.0)
    outs = []
    await steps_until(eng, lambda: late.id not in eng.requests, outs)
    assert [(o.request_id, o.finish_reason) for o in outs if o.request_id == late.id] == [(late.id, "deadline")]
    assert late.stats.rounds == 0
    await steps_until(eng, lambda: running(eng) == [first.id])
    assert await (await mirrored(eng)).holdings("d0") == {first.id: first.prompt_len + 40}


@pytest.mark.parametrize("gone", [None, "drafter"])
async def test_an_adopted_request_goes_back_to_the_replicas_that_hold_its_kv(started, index, gone):
    """Its orchestrator died; the replicas its record names still hold its KV, so the adopter places it there, though
    others are freer; only where a holder is gone too does it go to the freest live replica."""
    live = {"drafter": ["d0", "d1"], "guider": ["g0", "g1"]}
    first = await started(index, budget=100, live=live, owner="first")
    req = first.add_request("count from 1 to 9:", "streaming", max_new_tokens=40)
    await steps_until(first, lambda: req.stats.rounds >= 2)
    assert first.scheduler.admission.placement.where[req.id] == {"drafter": "d0", "guider": "g0"}  # ties: lowest
    await mirrored(first)
    admission = first.scheduler.admission
    for task in (admission.writer.task, admission.reserver.task):  # it dies: its lease lapses, its records stay
        await halt(task)
    await index.place("other", [["d0"], ["g0"]], 20, None)  # d1 and g1 are the freest now
    await index.place("third", [["d1"], ["g1"]], 10, None)  # d2, where there is one, is freer than d1
    await asyncio.sleep(0.2)
    second_live = {**live, "drafter": ["d1", "d2", "d3"]} if gone else live
    second = await started(index, budget=100, live=second_live, owner="second")
    adopted = await second.scheduler.admission.adopt(req.id)
    assert adopted.replicas == {"drafter": "d0", "guider": "g0"}
    second.add(adopted.req, adopted.strategy, adopted.params)
    await steps_until(second, lambda: running(second) == [req.id])
    want = {"drafter": "d2" if gone else "d0", "guider": "g0"}
    assert second.scheduler.admission.placement.where[req.id] == want
    index = await mirrored(second)
    tokens = req.prompt_len + 40
    assert await index.holdings(want["drafter"]) == {req.id: tokens, **({} if gone else {"other": 20})}
    assert await index.holdings("g0") == {req.id: tokens, "other": 20}
    entry = await index.get(req.id)
    assert (entry.drafter, entry.guider) == (want["drafter"], "g0")


class Flaky:
    """An index that can be down (IndexUnavailable) and can lose everything (a restart without persistence)."""

    def __init__(self, inner: RedisCacheIndex):
        self.inner, self.up = inner, True

    async def lose_everything(self) -> None:
        for key in await self.inner.storage_keys():
            await self.inner.client.delete(key)

    def __str__(self) -> str:
        return "Redis at test"

    def __getattr__(self, name):
        method = getattr(self.inner, name)

        async def call(*args, **kwargs):
            if not self.up:
                raise IndexUnavailable(f"cache index ({self}) unavailable: Connection refused")  # as RedisCacheIndex
            return await method(*args, **kwargs)

        return call


async def settled(admission: IndexAdmission, down: bool) -> None:
    for _ in range(300):
        if (admission.writer.down is not None) == down and not admission.writer.queue:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"writer never settled down={down}: {admission.writer.down}, {admission.writer.queue}")


@pytest.mark.parametrize(
    "noticed, lost",
    [("write", False), ("ping", False), ("ping", True), (None, True)],
    ids=["down-noticed-by-a-write", "down-noticed-by-the-lease", "restarted-empty", "restarted-empty-unnoticed"],
)
async def test_index_outage_loses_no_record_and_leaves_no_key(started, index, noticed, lost):
    """The index is unreachable for a while (noticed by a failed write or by the lease renewal), keeping its data or
    losing it (a restart without persistence); or it restarts empty between two writes, unnoticed but for a commit
    to a missing entry. A request ends meanwhile: its release must reach the index too."""
    index = Flaky(index)
    eng = await started(index, budget=1000)
    admission = eng.scheduler.admission
    ended = eng.add_request("count from 1 to 9:", "streaming", max_new_tokens=40)
    live = eng.add_request("copy: the lazy dog", "streaming", max_new_tokens=40)
    await steps_until(eng, lambda: len(running(eng)) == 2)
    await settled(admission, down=False)
    assert (await index.inner.get(ended.id)) is not None
    index.up = noticed is None
    if noticed == "ping":
        await settled(admission, down=True)
    eng.abort(ended.id)
    await eng.step_async(print)  # ends `ended`; `live` goes on from the admission's copy
    if noticed is not None:
        await settled(admission, down=True)
        with pytest.raises(Unavailable, match=r"cache index \(Redis at test\) unavailable: Connection refused"):
            eng.add_request("def add(a, b):", "streaming", max_new_tokens=8)
        await eng.step_async(print)
    if lost:
        await index.lose_everything()
    index.up = True
    await eng.step_async(print)  # unnoticed: this step's commit finds no entry
    await settled(admission, down=False)
    assert not set(request_keys(index.inner.prefix, ended.id)) & set(await index.inner.storage_keys())
    entry = await index.inner.get(live.id)
    assert entry.order == live.order and entry.token_ids == live.tokens[live.order].tolist()
    assert entry.committed_len == len(live.order) and entry.drafter == "d0"
    tokens = live.prompt_len + 40
    assert await index.inner.holdings("d0") == {live.id: tokens} == await index.inner.holdings("g0")
    again = eng.add_request("def add(a, b):", "streaming", max_new_tokens=8)
    await steps_until(eng, lambda: again.id in running(eng))
    eng.cancel([s.req for s in eng.requests.values()])
    await settled(admission, down=False)
    assert not [k for k in await index.inner.storage_keys() if ":req:" in k]


async def test_a_request_waiting_for_its_reservation_is_refused_when_the_index_goes_down(started, index):
    """The index went down before the writer noticed: the request passed the door, but it must not wait on Redis."""
    index = Flaky(index)
    eng = await started(index, budget=1000)
    index.up = False
    req = eng.add_request("count from 1 to 9:", "streaming", max_new_tokens=8)
    outs = []
    await steps_until(eng, lambda: req.id not in eng.requests, outs)
    [out] = [o for o in outs if o.request_id == req.id]
    assert isinstance(out.error, Unavailable) and req.stats.rounds == 0
    assert str(out.error) == "cache index (Redis at test) unavailable: Connection refused"
    index.up = True
    await settled(eng.scheduler.admission, down=False)
    again = eng.add_request("count from 1 to 9:", "streaming", max_new_tokens=8)
    await steps_until(eng, lambda: again.id in running(eng))  # the index is back: admitted


async def test_a_placed_request_wakes_the_engines_before_its_record_is_queued(engine, index):
    """The step that admits it then runs before the index writer sends the record (admission.placed)."""
    eng, events = engine_with(engine, index, budget=1000), []
    admission = eng.scheduler.admission
    await admission.start(lambda: events.append("wake"))
    push = admission.writer.push

    def pushed(write):
        events.append("push")
        push(write)

    admission.writer.push = pushed
    try:
        req = eng.add_request("count from 1 to 9:", "streaming", max_new_tokens=8)
        for _ in range(200):
            if events:
                break
            await asyncio.sleep(0.01)
        assert events == ["wake", "push"] and admission.admit(eng.requests[req.id])
    finally:
        eng.cancel([er.req for er in eng.requests.values()])
        await admission.stop()
