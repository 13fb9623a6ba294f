"""The reserver: the queue's requests reserved in one round trip, in FIFO order, none ahead of one without room, and
through a restart of the index."""

import asyncio
import uuid

import pytest

from services.common.placement import Placement
from services.common.request import Request
from services.orchestrator.cluster.reserver import Reserver
from services.orchestrator.engine.scheduler import EngineRequest
from services.serving.redis_index import RedisCacheIndex

pytestmark = pytest.mark.anyio


class Counted(RedisCacheIndex):
    """Counts the batches of places it sends."""

    batches: list[int]

    async def batch(self, ops):
        places = sum(op.method == "place" for op in ops)
        if places:
            self.batches.append(places)
        return await super().batch(ops)


@pytest.fixture
def index(redis_url):
    index = Counted.from_url(redis_url, prefix=f"test:{uuid.uuid4().hex[:8]}:")
    index.batches = []
    return index


def waiting(rid: str, tokens: int) -> EngineRequest:
    return EngineRequest(Request(rid, [1] * 4, tokens - 4, 0, 1), None, "pipeline")  # prompt 4 + the rest


def reserver(index, budget: int) -> tuple[Reserver, list[str]]:
    """A reserver over one drafter and one guider replica; -> it and the ids it placed, in order."""
    placement = Placement(("drafter", "guider"), lambda deployment: [deployment[0] + "0"], budget)
    placed: list[str] = []

    def on_placed(er, chosen):
        assert chosen == {"drafter": "d0", "guider": "g0"}
        placed.append(er.req.id)

    return Reserver(index, placement, on_placed, lambda er, error: pytest.fail(f"refused: {error}")), placed


async def until(done) -> None:
    for _ in range(200):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never done")


async def test_the_queue_is_reserved_in_one_round_trip_in_order(index):
    res, placed = reserver(index, budget=1000)
    for i in range(5):
        res.add(waiting(f"r{i}", 20))
    res.start()
    try:
        await until(lambda: len(placed) == 5)
    finally:
        await res.stop()
    assert placed == [f"r{i}" for i in range(5)] and index.batches == [5]
    assert await index.holdings("d0") == {f"r{i}": 20 for i in range(5)}


async def test_none_goes_ahead_of_a_request_without_room(index):
    res, placed = reserver(index, budget=100)
    await index.place("other", [["d0"], ["g0"]], 50, 100)  # another orchestrator's request
    res.add(waiting("big", 80))
    res.add(waiting("small", 20))  # fits, but waits behind big
    res.start()
    try:
        await until(lambda: len(index.batches) >= 2)  # a try of both, then of big alone
        assert placed == [] and await index.holdings("d0") == {"other": 50}  # what small got went back
        assert index.batches[:2] == [2, 1]
        await index.release("other")
        res.room()
        await until(lambda: len(placed) == 2)
    finally:
        await res.stop()
    assert placed == ["big", "small"]
    assert await index.holdings("d0") == {"big": 80, "small": 20}


async def test_a_request_withdrawn_while_its_batch_was_out_gives_its_reservation_back(index):
    res, placed = reserver(index, budget=1000)
    ers = [waiting("kept", 20), waiting("gone", 20)]
    batch = index.batch

    async def withdrawing(ops):  # it ends while its place is out
        replies = await batch(ops)
        res.withdraw(ers[1])
        return replies

    index.batch = withdrawing
    for er in ers:
        res.add(er)
    res.start()
    try:
        await until(lambda: placed == ["kept"] and not res.queue)
    finally:
        await res.stop()
    assert await index.holdings("d0") == {"kept": 20}


async def test_it_reserves_on_an_index_that_restarted(index):
    res, placed = reserver(index, budget=1000)
    await index.batch([])  # the scripts loaded
    await index.client.script_flush()  # what a restart does to them: the next batch fails
    res.add(waiting("r0", 20))
    res.start()
    try:
        await until(lambda: placed == ["r0"])
    finally:
        await res.stop()


async def test_a_withdrawn_request_without_room_holds_none_back(index):
    res, placed = reserver(index, budget=100)
    await index.place("other", [["d0"], ["g0"]], 50, 100)
    big = waiting("big", 80)
    res.add(big)
    res.add(waiting("small", 20))
    res.withdraw(big)  # it ended while it waited: it is dropped, not tried
    res.start()
    try:
        await until(lambda: placed == ["small"])
    finally:
        await res.stop()
    assert await index.holdings("d0") == {"other": 50, "small": 20}
