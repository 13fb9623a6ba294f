"""Takeover from the cache index's record: an orchestrator stops mid-stream (nothing more of it reaches Redis), a
second one adopts the request once the first one's lease has lapsed, never before, rebuilds it from the record alone
(its own hosts hold no KV of it) and the client's stream goes on with exactly the text of an undisturbed run, no
token repeated or missing, although the record is rounds behind what the client received. Seeded sampling at
temperature > 0; two in-process orchestrators on one redis-server."""

import asyncio
import uuid

import pytest

from services.common.config import EngineConfig
from services.common.sampling import SamplingParams
from services.orchestrator.api.deltas import Deltas
from services.orchestrator.api.frontend import Frontend, Spec
from services.orchestrator.cluster.admission import IndexAdmission
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.local_executor import LocalExecutor
from services.serving.cache_index import OwnerAlive
from services.serving.redis_index import RedisCacheIndex

pytestmark = pytest.mark.anyio

PROMPT = "count from 1 to 9:"
LEASE_S = 0.5
CASES = {
    "pipeline": {"window": 6},
    "streaming": {"window": 6},
    "slot": {"slot_size": 4, "block_size": 8, "kv": "recompute"},
}


def orchestrator(
    tiny_zoo, redis_url: str, prefix: str, owner: str, executor: LocalExecutor | None = None
) -> tuple[Frontend, IndexAdmission]:
    """An orchestrator with an admission of its own on the shared index, on these hosts or on hosts of its own."""
    config = EngineConfig(models=tiny_zoo, max_new_tokens=48)
    executor = executor or LocalExecutor(config)
    index = RedisCacheIndex.from_url(redis_url, prefix=prefix)
    admission = IndexAdmission(index, executor.placement, 60, owner, LEASE_S)
    return Frontend(Engine(config, executor, admission), records=admission), admission


def spec(strategy: str, request_id: str) -> Spec:
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=1234)
    return Spec(PROMPT, 48, strategy, CASES[strategy], sampling, request_id)


async def halt(task: asyncio.Task) -> None:
    """Cancel until it ends: redis-py swallows a cancel that comes while it waits for a reply."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.01)


async def kill(frontend: Frontend, admission: IndexAdmission) -> None:
    """Stop as a SIGKILLed process does: no release, no further write, no lease renewal."""
    for task in [*frontend.drivers, admission.writer.task, admission.reserver.task]:
        await halt(task)


@pytest.fixture
async def start(tiny_zoo, redis_url):
    """Starts orchestrators on one index of their own; kills them all at the end, so that a test that fails leaves
    no task behind (the event loop's close would wait on them)."""
    prefix, started = f"test:{uuid.uuid4().hex[:8]}:", []

    async def start(owner: str, executor: LocalExecutor | None = None) -> tuple[Frontend, IndexAdmission]:
        started.append(orchestrator(tiny_zoo, redis_url, prefix, owner, executor))
        await started[-1][0].start()
        return started[-1]

    yield start
    for frontend, admission in started:
        await kill(frontend, admission)


@pytest.mark.parametrize("record", ["behind", "ahead"])
@pytest.mark.parametrize("hosts", ["same", "new"])
@pytest.mark.parametrize("strategy", list(CASES))
async def test_an_adopted_stream_goes_on_with_the_undisturbed_text(start, strategy, hosts, record):
    """hosts: the adopter's; "same" still hold the request's KV, of rounds past its record, "new" hold none.
    record: behind the client's stream (rounds to decode again) or ahead of it (tokens to send again)."""
    first, first_admission = await start("orch-a")
    calm = Deltas(await first.open(spec(strategy, "calm")), first.detokenizer())
    undisturbed = [(d.ids, d.text) async for d in calm]
    want_ids, want_text = [i for ids, _ in undisturbed for i in ids], "".join(t for _, t in undisturbed)

    job = await first.open(spec(strategy, "moved"))
    stream, index = Deltas(job, first.detokenizer()).__aiter__(), first_admission.writer.index
    got = [await stream.__anext__()]
    if record == "behind":  # no record after this one reaches the index: the client gets rounds it does not have
        await halt(first_admission.writer.task)
        while sum(len(d.ids) for d in got) <= (await index.get("moved")).streamed:
            got.append(await stream.__anext__())
    else:  # the record has rounds whose tokens the client has not received
        while first_admission.records["moved"].entry.streamed <= len(got[0].ids):
            await asyncio.sleep(0)  # a step at a time: the engine's step waits on its thread
        for driver in first.drivers:
            await halt(driver)
        while first_admission.writer.queue:
            await asyncio.sleep(0.005)
        assert (await index.get("moved")).streamed > len(got[0].ids)
    await kill(first, first_admission)
    held_ids, held_text = [i for d in got for i in d.ids], "".join(d.text for d in got)
    assert len(held_ids) < len(want_ids), "the request ended before the kill"

    executor = first.engine.executor if hosts == "same" else None
    second, _ = await start("orch-b", executor)
    await index.lease("orch-a", LEASE_S)  # as if it had died just after a renewal
    with pytest.raises(OwnerAlive, match="orch-a"):  # its lease is still alive
        await second.resume(spec(strategy, "moved"))
    await asyncio.sleep(LEASE_S)
    resumed = Deltas(await second.resume(spec(strategy, "moved")), second.detokenizer())
    resumed.held_ids, resumed.held_chars = len(held_ids), len(held_text)
    rest = [(d.ids, d.text) async for d in resumed]
    assert held_ids + [i for ids, _ in rest for i in ids] == want_ids
    assert held_text + "".join(t for _, t in rest) == want_text
    await second.shutdown()
