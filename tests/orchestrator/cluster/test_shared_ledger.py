"""Two orchestrators, one KV ledger: two in-process orchestrators on the same model hosts, each with a placement of
its own (neither knows what the other admitted), share a budget of a few requests through the cache index on a real
redis-server. Under 32 concurrent streams the KV the hosts hold never exceeds the budget (read from each host's
KVManager between forwards), no request is ever reserved twice in the index, and every stream gets the text it gets
alone."""

import asyncio
import uuid
from dataclasses import replace

import pytest

from services.common.config import EngineConfig, ServingConfig
from services.common.contract import kv_hosts
from services.common.placement import Placement
from services.orchestrator.api.frontend import Frontend, Spec
from services.orchestrator.cluster.admission import IndexAdmission
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.local_executor import LocalExecutor
from services.serving.redis_index import RedisCacheIndex

pytestmark = pytest.mark.anyio

PROMPTS = ["count from 1 to 9:", "copy: the lazy dog", "reverse: a b c d e", "sort: 42 7 19 88 3 55"]
STRATEGY, PARAMS, TOKENS, STREAMS = "pipeline", {"window": 6}, 24, 32


@pytest.fixture
def hosts(tiny_zoo) -> tuple[LocalExecutor, list]:
    """Model hosts of their own, one replica each ("local"), and what each prompt decodes to alone on them."""
    executor = LocalExecutor(EngineConfig(models=tiny_zoo, max_new_tokens=TOKENS))
    return executor, Engine(executor.config, executor).generate(PROMPTS, STRATEGY, PARAMS, TOKENS)


async def test_two_orchestrators_never_overcommit_a_replica(hosts, redis_url):
    executor, alone = hosts
    config = executor.config
    need = {p: len(Engine(config, executor).request(p, TOKENS).prompt_ids) + TOKENS for p in PROMPTS}
    budget = 3 * max(need.values())  # three requests at a time, across both orchestrators
    config = replace(config, serving=ServingConfig(kv_budget_tokens=budget, max_queue=STREAMS))
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    orchestrators = []
    for owner in ("orch-a", "orch-b"):
        placement = Placement(kv_hosts(config.models), lambda host: ["local"], budget)
        admission = IndexAdmission(RedisCacheIndex.from_url(redis_url, prefix=prefix), placement, 60, owner, 2.0)
        orchestrators.append(Frontend(Engine(config, executor, admission), records=admission))
        await orchestrators[-1].start()
    index = orchestrators[0].records.writer.index
    kvs = {name: executor.host(name).kv for name in kv_hosts(config.models)}
    peaks = dict.fromkeys(kvs, 0)
    running = 0  # the most requests running at once, over both

    async def watch() -> None:
        nonlocal running
        loop = asyncio.get_running_loop()
        while True:
            held = await loop.run_in_executor(executor.worker, lambda: {h: kv.held() for h, kv in kvs.items()})
            for host, requests in held.items():
                peaks[host] = max(peaks[host], sum(requests.values()))
                assert sum(requests.values()) <= budget, f"{host} holds {requests}, over the budget {budget}"
            holdings = await index.holdings("local")
            assert sum(holdings.values()) <= budget, holdings
            assert all(holdings[rid] == need[PROMPTS[int(rid.split("-")[1]) % 4]] for rid in holdings), holdings
            running = max(running, sum(len(o.engine.scheduler.running) for o in orchestrators))
            await asyncio.sleep(0.005)

    async def stream(i: int) -> list[int]:
        frontend = orchestrators[i % 2]
        job = await frontend.open(Spec(PROMPTS[i % 4], TOKENS, STRATEGY, PARAMS, request_id=f"s-{i}"))
        return [token for out in [out async for out in job.outputs()] for token in out.ids]

    watcher = asyncio.create_task(watch())
    try:
        outputs = await asyncio.gather(*(stream(i) for i in range(STREAMS)))
        assert not watcher.done(), watcher.exception()
    finally:
        watcher.cancel()
        for frontend in orchestrators:
            await frontend.shutdown()
    assert outputs == [alone[i % 4].token_ids for i in range(STREAMS)]
    assert running == 3  # the budget binds: three at a time, never more, and both orchestrators fill it
    assert min(peaks["drafter"], peaks["guider"]) > max(need.values()), peaks  # several requests' KV at once
    assert await index.replica_tokens("local") == 0
