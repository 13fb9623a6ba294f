"""The frontend's driver sleeps while its engine has nothing to run, and still ends a waiting request on time."""

import asyncio
import time

from services.common.placement import Placement
from services.orchestrator.api.frontend import Frontend, Spec
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.scheduler import LedgerAdmission


def test_a_request_that_can_never_be_admitted_ends_at_its_deadline(engine):
    no_replica = Placement(["drafter"], lambda host: [], engine.config.serving.kv_budget_tokens)
    frontend = Frontend(Engine(engine.config, engine.executor, LedgerAdmission(no_replica)))

    async def scenario() -> tuple[list, str | None, float]:
        await frontend.start()
        start = time.monotonic()
        job = await frontend.open(Spec("count from 1 to 9:", 8, "streaming", deadline=start + 0.3))
        ids = [i async for out in job.outputs() for i in out.ids]
        waited = time.monotonic() - start
        await frontend.shutdown()
        return ids, job.finish_reason, waited

    ids, finish_reason, waited = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert (ids, finish_reason) == ([], "deadline")
    assert 0.3 <= waited < 1.5


def counting_steps(frontend: Frontend) -> list[int]:
    """Steps each engine of the frontend runs from now on."""
    steps = [0] * len(frontend.engines)
    for i, eng in enumerate(frontend.engines):

        async def step_async(emit, i=i, step=eng.step_async):
            steps[i] += 1
            return await step(emit)

        eng.step_async = step_async
    return steps


def test_a_request_waiting_for_room_on_one_engine_starts_when_a_request_on_another_ends(engine):
    """Its room is freed at the other engine's step, after that step emitted the last output: the release wakes it.
    Both requests' KV is released by the time the frontend has shut down."""
    need = len(engine.request("count from 1 to 9:", 8).prompt_ids) + 8
    ledger = Placement(["drafter", "guider"], lambda host: [f"{host}-0"], need + need // 2)  # room for one at a time
    frontend = Frontend(*(Engine(engine.config, engine.executor, LedgerAdmission(ledger)) for _ in range(2)))

    async def scenario() -> list[str | None]:
        await frontend.start()
        jobs = [await frontend.open(Spec("count from 1 to 9:", 8, "streaming", {"window": 6})) for _ in range(2)]
        assert jobs[0].engine is not jobs[1].engine
        for job in jobs:
            [out async for out in job.outputs()]
        await frontend.shutdown()
        return [job.finish_reason for job in jobs]

    assert asyncio.run(asyncio.wait_for(scenario(), 10)) == ["length", "length"]
    assert not [rid for host in engine.executor.hosts.values() if hasattr(host, "kv") for rid in host.kv.caches]


def test_an_ended_request_steps_no_engine_that_has_nothing_to_run(engine):
    """Nor does its stream's closing cancel, once it ended: each step is one of its rounds."""
    frontend = Frontend(*(Engine(engine.config, engine.executor) for _ in range(2)))

    async def scenario() -> tuple[list[int], int]:
        await frontend.start()
        await asyncio.sleep(0.05)  # each driver's first step, with nothing to run
        steps = counting_steps(frontend)
        job = await frontend.open(Spec("count from 1 to 9:", 8, "streaming", {"window": 6}))
        [out async for out in job.outputs()]
        job.cancel()
        await asyncio.sleep(0.05)
        counted = list(steps)
        await frontend.shutdown()
        return counted, job.stats()["rounds"]

    steps, rounds = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert rounds > 0 and steps == [rounds, 0]
