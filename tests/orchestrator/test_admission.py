"""KV admission: a bounded queue in front of each replica's budget, and an index kept round by round."""

import asyncio

import pytest

from services.orchestrator.admission import KVAdmission, ResourceExhausted
from services.serving.cache_index import EmbeddedCacheIndex


def admission(budget: int, max_queue: int) -> KVAdmission:
    return KVAdmission(EmbeddedCacheIndex(), {"drafter": "d0", "guider": "g0"}, budget, max_queue, ttl_s=60)


def test_queue_then_refuse_then_admit_on_release(engine):
    async def scenario():
        adm = admission(budget=60, max_queue=1)
        first = engine.request("count from 1 to 9:", max_new_tokens=40)
        await adm.admit(first, "streaming", {}, timeout_s=5)
        assert adm.index.replica_tokens("d0") == first.prompt_len + 40
        second = engine.request("copy: the lazy dog", max_new_tokens=40)
        waiting = asyncio.create_task(adm.admit(second, "streaming", {}, timeout_s=5))
        await asyncio.sleep(0.05)
        assert not waiting.done() and adm.waiting == 1
        third = engine.request("def add(a, b):", max_new_tokens=40)
        with pytest.raises(ResourceExhausted, match="waiting"):
            await adm.admit(third, "streaming", {}, timeout_s=5)
        await asyncio.get_running_loop().run_in_executor(None, adm.release, first.id)
        await asyncio.wait_for(waiting, 2)
        assert adm.index.get(second.id) is not None and adm.index.get(first.id) is None

    asyncio.run(scenario())


def test_request_larger_than_budget_is_refused(engine):
    async def scenario():
        req = engine.request("count from 1 to 9:", max_new_tokens=40)
        with pytest.raises(ResourceExhausted, match="budget"):
            await admission(budget=10, max_queue=4).admit(req, "streaming", {}, timeout_s=1)

    asyncio.run(scenario())


def test_tracked_rounds_record_commits_and_release(engine):
    async def scenario():
        adm = admission(budget=1000, max_queue=4)
        req = engine.request("count from 1 to 9:", max_new_tokens=12)
        await adm.admit(req, "slot", {}, timeout_s=1)
        rounds = adm.track(req, engine.stream(req, "slot", {"slot_size": 4, "block_size": 8}))
        first = next(rounds)
        entry = adm.index.get(req.id)
        assert entry.order == req.order and entry.token_ids == req.tokens[req.order].tolist()
        assert first is not None
        rounds.close()  # a cancelled request: everything goes
        assert adm.index.keys(req.id) == [] and adm.index.replica_tokens("d0") == 0

    asyncio.run(scenario())


def test_unstarted_request_releases_on_close(engine):
    async def scenario():
        adm = admission(budget=1000, max_queue=4)
        req = engine.request("count from 1 to 9:", max_new_tokens=12)
        await adm.admit(req, "streaming", {}, timeout_s=1)
        adm.track(req, engine.stream(req, "streaming")).close()
        assert adm.index.get(req.id) is None

    asyncio.run(scenario())
