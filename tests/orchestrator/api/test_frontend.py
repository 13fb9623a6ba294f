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
