"""The scheduler admits against the KV ledger: a request that does not fit waits, FIFO, until one ends."""

import asyncio

from services.common.placement import Placement
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.scheduler import LedgerAdmission

PROMPT = "count from 1 to 9:"


def test_a_request_waits_for_room_and_runs_once_the_first_frees_it(engine):
    need = len(engine.request(PROMPT, 8).prompt_ids) + 8
    ledger = Placement(["drafter", "guider"], lambda host: [f"{host}-0"], need + need // 2)  # room for one at a time
    eng = Engine(engine.config, engine.executor, LedgerAdmission(ledger))
    first, second = (eng.add_request(PROMPT, "streaming", {"window": 6}, 8) for _ in range(2))
    plan = asyncio.run(eng.step_async(lambda out: None))
    assert list(plan.running) == [first.id] and plan.waiting == 1
    assert ledger.used == {"drafter-0": need, "guider-0": need}
    while first.id in eng.requests:  # the second waits while the first holds the room
        assert {out.request_id for out in eng.step()} == {first.id}
    plan = asyncio.run(eng.step_async(lambda out: None))
    assert second.id in plan.running
    eng.cancel([second])
    assert set(ledger.used.values()) == {0} and ledger.where == {}
