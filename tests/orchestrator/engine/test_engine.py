"""The batch-first engine: one step advances every running request one round, with one batched host call per
(role, method) and phase, and a request decoded among others gets exactly the tokens it gets alone."""

import asyncio
import time

import pytest

from services.common.sampling import SamplingParams
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.scheduler import LedgerAdmission

PROMPTS = ["count from 1 to 9:", "copy: the lazy dog", "def add(a, b):", "sort 5 3 9 1:"]
MIXED = [
    ("pipeline", {"window": 6}),
    ("streaming", {"window": 6}),
    ("guided", {"block_size": 8}),
    ("guided", {"block_size": 8, "drafter": "causal"}),
    ("slot", {"slot_size": 4, "block_size": 8}),
    ("ar", {"model": "guider"}),
    ("ar", {"model": "ar"}),
    ("threshold", {"block_size": 8, "cache": "dual"}),
]


def own_engine(engine) -> Engine:
    """An engine of its own (its own scheduler) over the session's loaded models."""
    return Engine(engine.config, executor=engine.executor)


def test_the_streams_take_every_round_before_the_bookkeeping(engine):
    """engine.update emits every round and takes a finished request out (its budget and KV released, with no last
    commit), then gives the streams' tasks a turn before any record's progress or a finished request's telemetry: a
    client's tokens wait on none of that bookkeeping."""
    events = []

    class Recording(LedgerAdmission):
        def progress(self, er):
            events.append(("progress", er.req.id))

        def release(self, er):
            events.append(("release", er.req.id))
            super().release(er)

    eng = Engine(engine.config, engine.executor, Recording(engine.executor.placement))
    finished = eng.telemetry.finished
    eng.telemetry.finished = lambda er, error=None: events.append(("telemetry", er.req.id)) or finished(er, error)
    going = eng.add_request("count from 1 to 9:", "streaming", {"window": 6}, 8)
    ending = eng.add_request("count from 1 to 9:", "streaming", {"window": 6}, 1)  # ends in its first round

    async def step():
        outputs: asyncio.Queue[str] = asyncio.Queue()

        async def stream():
            while True:
                events.append(("stream", await outputs.get()))

        reader = asyncio.create_task(stream())
        await asyncio.sleep(0)  # the reader waits on its queue, as a stream's task does

        def emit(out):
            events.append(("emit", out.request_id))
            outputs.put_nowait(out.request_id)

        await eng.step_async(emit)
        reader.cancel()

    asyncio.run(step())
    assert events == [
        ("emit", going.id),
        ("emit", ending.id),
        ("release", ending.id),
        ("stream", going.id),
        ("stream", ending.id),
        ("progress", going.id),
        ("telemetry", ending.id),
    ]


def test_mixed_batch_gives_each_request_its_tokens_alone(engine):
    eng = own_engine(engine)
    jobs = [
        (PROMPTS[i % 4], s, p, SamplingParams(temperature=0.8, top_p=0.95, seed=100 + i))
        for i, (s, p) in enumerate(MIXED)
    ]
    alone = [eng.generate(prompt, s, p, 16, sampling) for prompt, s, p, sampling in jobs]
    calls: list[dict] = []
    execute = eng.executor.execute

    async def recording(groups, parents=None):
        calls.append({key: len(args) for key, args in groups.items()})
        return await execute(groups, parents)

    eng.executor.execute = recording
    try:
        reqs = [eng.add_request(prompt, s, p, 16, sampling) for prompt, s, p, sampling in jobs]
        first = eng.step()
    finally:
        del eng.executor.execute
    assert {out.request_id for out in first} == {req.id for req in reqs}  # one step: one round for each
    assert calls[0][("drafter", "propose")] == 4  # pipeline, streaming, causal guided, slot: one batched call
    assert calls[0][("drafter", "propose_bidirectional")] == 2  # guided and threshold share a forward
    assert calls[0][("guider", "next_token")] == 1 and calls[0][("ar", "next_token")] == 1
    assert calls[1][("guider", "verify")] == 3 and calls[1][("filter", "accept_probs")] == 1
    while eng.has_unfinished():
        eng.step()
    for req, expected in zip(reqs, alone, strict=True):
        assert req.output_ids() == expected.token_ids
        assert req.finish_reason == expected.finish_reason


def test_generate_takes_a_list_of_prompts(engine):
    eng = own_engine(engine)
    together = eng.generate(PROMPTS, "streaming", {"window": 6}, 12)
    assert [r.token_ids for r in together] == [
        eng.generate(p, "streaming", {"window": 6}, 12).token_ids for p in PROMPTS
    ]


def test_max_concurrency_bounds_the_running_set(engine):
    config = type(engine.config)(models=engine.config.models, serving={"max_concurrency": 2})
    eng = Engine(config, executor=engine.executor)
    reqs = [eng.add_request(p, "streaming", {"window": 6}, 8) for p in PROMPTS]
    assert {out.request_id for out in eng.step()} == {reqs[0].id, reqs[1].id}  # FIFO admission
    assert len(eng.scheduler.running) == 2 and len(eng.scheduler.waiting) == 2
    while eng.has_unfinished():
        eng.step()
    assert all(r.finished for r in reqs)


def test_abort_ends_the_request_and_frees_its_kv(engine):
    eng = own_engine(engine)
    req = eng.add_request(PROMPTS[0], "pipeline", {"window": 4}, 64)
    eng.step()
    assert req.id in eng.executor.host("drafter").held() and req.id in eng.executor.host("guider").held()
    eng.abort(req.id)
    [out] = eng.step()
    assert (out.request_id, out.finish_reason) == (req.id, "cancelled")
    assert req.id not in eng.executor.host("drafter").held() and req.id not in eng.executor.host("guider").held()
    assert not eng.has_unfinished()


def test_a_failing_host_call_fails_only_its_group(engine):
    eng = own_engine(engine)
    execute = eng.executor.execute

    async def failing(groups, parents=None):
        results = await execute(groups, parents)
        if ("ar", "next_token") in results:
            results["ar", "next_token"] = RuntimeError("replica lost")
        return results

    eng.executor.execute = failing
    try:
        broken = eng.add_request(PROMPTS[0], "ar", {"model": "ar"}, 8)
        fine = eng.add_request(PROMPTS[1], "streaming", {"window": 6}, 8)
        outs = {out.request_id: out for out in eng.step()}
    finally:
        del eng.executor.execute
    assert "replica lost" in str(outs[broken.id].error) and outs[broken.id].finish_reason == "error"
    assert outs[fine.id].error is None and fine.id in eng.requests
    eng.cancel([fine])


class StalledHosts:
    """Remote hosts whose replica never answers."""

    def __init__(self, executor):
        self.executor, self.released = executor, []

    resuming: set[str] = set()

    def __getattr__(self, name):
        return getattr(self.executor, name)

    async def execute(self, groups, parents=None):
        await asyncio.Event().wait()

    def release(self, role, ids):
        self.released.append((role, ids))


def test_deadline_ends_a_request_while_its_call_is_stalled(engine):
    eng = Engine(engine.config, executor=StalledHosts(engine.executor))
    req = eng.request(PROMPTS[0], 8)
    eng.add(req, "streaming", {"window": 6}, deadline=time.monotonic() + 0.3)
    ended = []

    async def scenario():
        step = asyncio.create_task(eng.step_async(ended.append))
        start = time.monotonic()
        while not ended:
            await asyncio.sleep(0.01)
            assert time.monotonic() - start < 2, "the deadline did not end the request"
        step.cancel()
        return time.monotonic() - start

    waited = asyncio.run(scenario())
    assert waited < 0.3 + 0.5
    assert [(o.request_id, o.finish_reason) for o in ended] == [(req.id, "deadline")]
    assert not eng.has_unfinished()


@pytest.mark.parametrize("strategy,params", [("pipeline", {"window": 6}), ("slot", {"slot_size": 4, "block_size": 8})])
def test_stats_count_forwards_per_request(engine, strategy, params):
    eng = own_engine(engine)
    result = eng.generate(PROMPTS[0], strategy, params, 12)
    stats = result.stats
    assert stats["drafter_forwards"] >= stats["rounds"] > 0
    if strategy == "pipeline":
        assert stats["guider_forwards"] == stats["filter_calls"] == stats["rounds"]
    else:
        assert stats["guider_forwards"] == 0 and stats["drafter_forwards"] <= 2 * stats["rounds"]


@pytest.mark.parametrize(
    "strategy,params",
    [("ar", {}), ("slot", {"slot_size": 4, "block_size": 8}), ("guided", {"block_size": 8}), ("pipeline", {})],
)
def test_model_forwards_count_every_model_call(engine, strategy, params):
    """A slot round is two drafter forwards, a guided round a drafter and a guider forward, a pipeline round adds
    the filter's call: model_forwards counts each, where TPF counts rounds."""
    eng = own_engine(engine)
    calls = []
    execute = eng.executor.execute

    async def recording(groups, parents=None):
        calls.append(sum(len(args) for args in groups.values()))
        return await execute(groups, parents)

    eng.executor.execute = recording
    try:
        stats = eng.generate(PROMPTS[0], strategy, params, 12).stats
    finally:
        del eng.executor.execute
    assert stats["model_forwards"] == sum(calls)
    assert stats["model_forwards"] == stats["drafter_forwards"] + stats["guider_forwards"] + stats["filter_calls"]
    assert stats["tokens_per_forward"] == stats["tokens"] / stats["model_forwards"]
    assert stats["model_forwards"] == stats["rounds"] if strategy == "ar" else stats["model_forwards"] > stats["rounds"]
