"""One step, written once: `Engine.step()` (the library), `Engine.step_async` under the frontend's driver (both
servers), in process and over the remote executor, run the same code and give the same tokens. The remote executor
here talks to stand-in Serve handles whose replicas are the in-process hosts, across a pickled hop."""

import asyncio
import pickle
from types import SimpleNamespace

import pytest

import services.serving.pickling  # noqa: F401  the hop's reducers
from services.common.contract import host_of
from services.common.sampling import SamplingParams
from services.orchestrator.api.frontend import Frontend, Spec
from services.orchestrator.cluster.remote_executor import RemoteExecutor
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.local_executor import LocalExecutor
from services.serving import live_replicas

PROMPT = "count from 1 to 9:"
SEEDED = SamplingParams(temperature=0.8, top_p=0.95, seed=7)


class Handle:
    """A Serve handle whose one replica is an in-process host; arguments and replies cross as pickles."""

    def __init__(self, host, name: str):
        self.host, self.calls, self.deployment_name = host, [], name
        self.run = SimpleNamespace(remote=self.remote_run)
        self.release = SimpleNamespace(remote=lambda ids, replica=None: self.host.release(ids))
        self.check_health = SimpleNamespace(remote=self.ok)
        self.block_sizes = SimpleNamespace(remote=self.sizes)

    async def remote_run(self, method, args, parents, replica=None):
        self.calls.append(method)
        args = pickle.loads(pickle.dumps(args))
        return pickle.loads(pickle.dumps(getattr(self.host, method)(args)))

    async def ok(self):
        return None

    async def sizes(self):
        return self.host.block_sizes()


@pytest.fixture
def remote(engine, monkeypatch) -> RemoteExecutor:
    local = LocalExecutor(engine.config)
    hosts = {host_of(model) for model in engine.config.models}
    monkeypatch.setattr(live_replicas, "LIVE", {host: [f"{host}-0"] for host in hosts})
    return RemoteExecutor(engine.config, {host: Handle(local.host(host), host) for host in hosts})


@pytest.mark.parametrize("sampling", [SEEDED, SamplingParams()], ids=["seeded", "greedy"])
@pytest.mark.parametrize("strategy", ["pipeline", "slot", "threshold"])
def test_step_over_the_remote_executor_gives_the_in_process_tokens(engine, remote, strategy, sampling):
    asyncio.run(remote.start())
    local = Engine(engine.config).generate(PROMPT, strategy, max_new_tokens=16, sampling=sampling)
    served = Engine(engine.config, remote).generate(PROMPT, strategy, max_new_tokens=16, sampling=sampling)
    assert served.token_ids == local.token_ids
    assert served.stats["rounds"] == local.stats["rounds"]
    assert "propose" in remote.handles["drafter"].calls or "propose_bidirectional" in remote.handles["drafter"].calls


@pytest.mark.parametrize("guesses", [1, 16])
@pytest.mark.parametrize("sampling", [SEEDED, SamplingParams()], ids=["seeded", "greedy"])
def test_overlap_over_the_remote_executor_gives_the_in_process_tokens_without_it(engine, remote, sampling, guesses):
    """The speculative proposals cross the hop with their own RNG states (seeded), or none (greedy)."""
    asyncio.run(remote.start())
    off = Engine(engine.config).generate(PROMPT, "pipeline", {"overlap": False}, max_new_tokens=24, sampling=sampling)
    on = Engine(engine.config, remote).generate(
        PROMPT, "pipeline", {"overlap": True, "guesses": guesses}, max_new_tokens=24, sampling=sampling
    )
    assert on.token_ids == off.token_ids
    assert "propose_after" in remote.handles["drafter"].calls


@pytest.mark.parametrize("executor", ["local", "remote"])
def test_the_frontends_driver_runs_the_same_step(engine, remote, executor):
    reference = Engine(engine.config).generate(PROMPT, "pipeline", max_new_tokens=16, sampling=SEEDED)

    async def serve() -> list[int]:
        frontend = Frontend(Engine(engine.config, remote if executor == "remote" else None))
        await frontend.start()
        job = await frontend.open(Spec(PROMPT, 16, "pipeline", sampling=SEEDED))
        ids = [i async for out in job.outputs() for i in out.ids]
        await frontend.shutdown()
        return ids

    assert asyncio.run(serve()) == reference.token_ids


def test_a_step_prints_its_plan(engine):
    eng = Engine(engine.config)
    req = eng.add_request(PROMPT, "pipeline", max_new_tokens=8)
    late = eng.add_request(PROMPT, "threshold", max_new_tokens=8)
    eng.abort(late.id)
    plan = asyncio.run(eng.step_async(lambda out: None))
    assert plan.running == {req.id: "pipeline"} and plan.ending == {late.id: "cancelled"}
    assert str(plan) == f"step: run [{req.id}:pipeline] end [{late.id}:cancelled] waiting 0"
    eng.cancel([req])
