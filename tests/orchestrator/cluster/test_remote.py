"""RemoteExecutor over stand-in deployment handles: a group splits into one call per replica holding its requests' KV,
and the requests of a lost or scaled-down replica move to a live one and their call goes again."""

import asyncio
from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError

from services.common.config import EngineConfig, ServingConfig
from services.common.contract import Reply
from services.orchestrator.cluster.remote_executor import RemoteExecutor
from services.orchestrator.engine.scheduler import Unavailable
from services.serving import live_replicas


class Deployment:
    """A handle whose `run` answers each call with the replica that took it, or dies on the replicas in `dead`."""

    def __init__(self, dead: set[str] = frozenset()):
        self.calls: list[tuple[str | None, list[str]]] = []
        self.dead = set(dead)
        self.run = SimpleNamespace(remote=self.remote)
        self.deployment_name = "drafter"  # whose live replicas the test publishes

    async def remote(self, method, args, parents, replica=None):
        self.calls.append((replica, [call.req.id for call in args]))
        if replica in self.dead:
            raise ActorDiedError()
        return [Reply(replica) for _ in args]


@pytest.fixture
def hosts(monkeypatch):
    monkeypatch.setattr(live_replicas, "LIVE", {"drafter": ["d0", "d1"]})
    drafter = Deployment()
    config = EngineConfig(models={"drafter": "d", "filter": "f"}, serving=ServingConfig(resume_timeout_s=0.5))
    return RemoteExecutor(config, {"drafter": drafter, "filter": Deployment()}), drafter


def calls(*rids: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(req=SimpleNamespace(id=rid)) for rid in rids]


def run(remote: RemoteExecutor, groups: dict) -> dict:
    """One phase's results: the executor sends its calls on the running loop."""

    async def phase():
        return await remote.execute(groups)

    return asyncio.run(phase())


def values(results, key=("drafter", "propose")) -> list:
    return [reply.value for reply in results[key]]


def test_a_group_goes_to_each_replica_with_only_the_requests_it_holds(hosts):
    remote, drafter = hosts
    for rid, tokens in [("a", 10), ("b", 10), ("c", 10)]:
        remote.placement.place(rid, tokens)  # a -> d0, b -> d1, c -> d0
    results = run(remote, {("drafter", "propose"): calls("a", "b", "c")})
    assert values(results) == ["d0", "d1", "d0"]
    assert sorted(drafter.calls) == [("d0", ["a", "c"]), ("d1", ["b"])]


def test_every_call_is_sent_before_execute_returns(hosts):
    """Sent at once on the running loop (DirectHandle.start writes the frame), not when the loop next runs the
    phase's task: a step's calls went out behind the streams and index writes the step before had queued."""
    remote, drafter = hosts
    sent, remote_call = [], drafter.run.remote

    def start(method, args, parents, replica=None):
        sent.append(replica)
        return remote_call(method, args, parents, replica)

    drafter.run = SimpleNamespace(remote=start)
    remote.placement.place("a", 10), remote.placement.place("b", 10)

    async def phase():
        results = remote.execute({("drafter", "propose"): calls("a", "b")})
        assert sorted(sent) == ["d0", "d1"]  # before this coroutine let the loop run anything
        return await results

    assert values(asyncio.run(phase())) == ["d0", "d1"]


def test_a_group_that_fails_before_its_call_is_sent_fails_alone(hosts):
    remote, _ = hosts
    remote.placement.place("a", 10)

    def unpicklable(method, args, parents, replica=None):
        raise TypeError("cannot pickle the call")  # as DirectHandle.start would, sending it

    remote.handles["filter"].run = SimpleNamespace(remote=unpicklable)
    groups = {("ar", "decode"): calls("a"), ("filter", "accept_probs"): calls("a"), ("drafter", "propose"): calls("a")}
    results = run(remote, groups)
    assert isinstance(results["ar", "decode"], ValueError) and "'ar' is not served" in str(results["ar", "decode"])
    assert isinstance(results["filter", "accept_probs"], TypeError)
    assert values(results) == ["d0"]


def test_a_lost_replicas_requests_move_and_their_call_goes_again(hosts):
    remote, drafter = hosts
    remote.placement.place("a", 10), remote.placement.place("b", 10)
    drafter.dead.add("d0")
    results = run(remote, {("drafter", "propose"): calls("a", "b")})
    assert values(results) == ["d1", "d1"]
    assert ("d0", ["a"]) in drafter.calls and ("d1", ["a"]) in drafter.calls
    assert remote.placement.replica("a", "drafter") == "d1" and not remote.resuming


def test_a_scaled_down_replicas_requests_move_before_the_call(hosts):
    remote, drafter = hosts
    remote.placement.place("a", 10), remote.placement.place("b", 10)
    live_replicas.LIVE["drafter"] = ["d1"]  # Serve drained d0
    assert values(run(remote, {("drafter", "propose"): calls("a", "b")})) == ["d1", "d1"]
    assert drafter.calls == [("d1", ["a", "b"])]


def test_no_live_replica_within_the_resume_timeout_is_unavailable(hosts):
    remote, drafter = hosts
    remote.placement.place("a", 10)
    drafter.dead.update({"d0", "d1"})
    live_replicas.LIVE["drafter"] = ["d0"]
    results = run(remote, {("drafter", "propose"): calls("a")})
    assert isinstance(results["drafter", "propose"], Unavailable)


def test_the_stateless_filter_is_one_call_to_any_replica(hosts):
    remote, _ = hosts
    filter_ = remote.handles["filter"]
    run(remote, {("filter", "accept_probs"): calls("a", "b")})
    assert filter_.calls == [(None, ["a", "b"])]


def test_a_stateless_call_whose_replica_was_lost_goes_again_until_one_answers(hosts):
    """A colocated replica's death takes the filter with it: the round goes on once Serve has another."""
    remote, _ = hosts
    filter_ = remote.handles["filter"]
    filter_.dead.add(None)

    async def phase():
        asyncio.get_running_loop().call_later(0.3, filter_.dead.clear)
        return await remote.execute({("filter", "accept_probs"): calls("a")})

    assert values(asyncio.run(phase()), ("filter", "accept_probs")) == [None]
    assert len(filter_.calls) > 1


def test_a_stateless_call_with_no_live_replica_within_the_resume_timeout_is_unavailable(hosts):
    remote, _ = hosts
    remote.handles["filter"].dead.add(None)
    results = run(remote, {("filter", "accept_probs"): calls("a")})
    assert isinstance(results["filter", "accept_probs"], Unavailable)
