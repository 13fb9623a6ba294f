"""KV admission: the scheduler's queue in front of each replica's budget, and an index kept round by round."""

import pytest

from services.orchestrator.admission import IndexAdmission
from services.orchestrator.engine import Engine
from services.orchestrator.placement import Placement
from services.orchestrator.scheduler import ResourceExhausted
from services.serving.cache_index import EmbeddedCacheIndex


def engine_with(engine, budget: int, max_queue: int = 4) -> Engine:
    index = EmbeddedCacheIndex()
    placement = Placement(("drafter", "guider"), lambda deployment: [deployment[0] + "0"], budget)
    admission = IndexAdmission(index, placement, ttl_s=60)
    config = engine.config
    serving = type(config.serving)(kv_budget_tokens=budget, max_queue=max_queue)
    return Engine(type(config)(models=config.models, serving=serving), models=engine.models, admission=admission)


def test_queue_then_refuse_then_admit_on_release(engine):
    eng = engine_with(engine, budget=60, max_queue=1)
    index = eng.scheduler.admission.index
    first = eng.add_request("count from 1 to 9:", "streaming", max_new_tokens=40)
    eng.step()
    assert index.replica_tokens("d0") == first.prompt_len + 40
    second = eng.add_request("copy: the lazy dog", "streaming", max_new_tokens=40)
    eng.step()
    assert [s.req.id for s in eng.scheduler.waiting] == [second.id]  # no room: it waits
    with pytest.raises(ResourceExhausted, match="waiting"):
        eng.add_request("def add(a, b):", "streaming", max_new_tokens=40)
    eng.abort(first.id)
    eng.step()  # the abort frees first's tokens, and second is admitted in the same step
    assert index.get(first.id) is None and index.get(second.id) is not None
    assert [s.req.id for s in eng.scheduler.running] == [second.id]
    eng.cancel([second])


def test_request_larger_than_budget_is_refused(engine):
    with pytest.raises(ResourceExhausted, match="budget"):
        engine_with(engine, budget=10).add_request("count from 1 to 9:", "streaming", max_new_tokens=40)


def test_index_records_commits_and_forgets_the_request(engine):
    eng = engine_with(engine, budget=1000)
    req = eng.request("count from 1 to 9:", max_new_tokens=12)
    rounds = eng.stream(req, "slot", {"slot_size": 4, "block_size": 8})
    next(rounds)
    entry = eng.scheduler.admission.index.get(req.id)
    assert entry.order == req.order and entry.token_ids == req.tokens[req.order].tolist()
    assert entry.strategy == "slot" and entry.drafter == "d0"
    rounds.close()  # a cancelled request: everything goes
    index = eng.scheduler.admission.index
    assert index.keys(req.id) == [] and index.replica_tokens("d0") == 0
    assert all(req.id not in host.kv.caches for host in eng.models.hosts.values() if hasattr(host, "kv"))


def test_waiting_request_past_its_deadline_ends_without_running(engine):
    eng = engine_with(engine, budget=60)
    first = eng.add_request("count from 1 to 9:", "streaming", max_new_tokens=40)
    late = eng.request("copy: the lazy dog", max_new_tokens=40)
    eng.add(late, "streaming", deadline=0.0)
    outs = eng.step()
    assert [(o.request_id, o.event.finish_reason) for o in outs if o.request_id == late.id] == [(late.id, "deadline")]
    assert late.stats.rounds == 0
    eng.cancel([first])
