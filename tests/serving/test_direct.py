"""DirectHandle over a stand-in Serve handle and stand-in replicas serving real channels (ReplicaHost.answer), each
running two hosts as a colocated one does: a round's calls run on the named replica, whose channel is learnt once
through Serve; a dead replica's ChannelClosed reaches the remote executor and the replica is asked for again; a
stateless deployment's calls take its live replicas in turn; KV is freed over the replica's channel, or through Serve
before one is known; a host's error fails the call, not the channel; a call reports the replica's KV usage; each
host's calls and releases reach that host."""

import asyncio
import socket
import time
from types import SimpleNamespace

import pytest

from services.common.contract import Reply
from services.serving import live_replicas
from services.serving.channel import ChannelClosed, ChannelServer
from services.serving.direct import DirectHandle
from services.serving.replica import ReplicaHost
from services.serving.request_sync import Mirror


class Host:
    """A model host: records what it ran."""

    def __init__(self, name: str, ran: list):
        self.name, self.ran = name, ran

    def propose(self, args: list) -> list[Reply]:
        self.ran.append((self.name, "propose", args))
        return [Reply(self.name) for _ in args]

    def verify(self, args: list) -> list[Reply]:
        raise ValueError(f"bad draft on {self.name}")

    def release(self, request_ids: list[str]) -> None:
        self.ran.append((self.name, "release", request_ids))


class Replica(ReplicaHost):
    """A replica as start_replica makes it, without Serve: a colocated one (a drafter and a guider host)."""

    def __init__(self, name: str, ran: list):
        self.hosts = {"drafter": Host(name, ran), "guider": Host(f"{name} guider", ran)}
        self.deployment, self.replica, self.kv, self.kv_budget = "models", name, [], 1
        self.mirrors: list[Mirror] = []  # each connection's copies of the requests, as it opened
        self.channel = ChannelServer("127.0.0.1", self.answer, self.mirror)

    def mirror(self) -> Mirror:
        self.mirrors.append(Mirror())
        return self.mirrors[-1]


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """A Serve handle: `endpoint` answers the replica named when it lives, else the first live one."""

    def __init__(self, ran: list):
        self.asked, self.released = [], []
        self.replicas = {name: Replica(name, ran) for name in ("r0", "r1")}
        self.dead: set[str] = set()
        self.endpoint = SimpleNamespace(remote=self.get_endpoint)
        self.release = SimpleNamespace(remote=self.release_remote)
        self.deployment_name = "drafter"

    def release_remote(self, host: str, ids: list[str], replica: str | None = None) -> None:
        self.released.append((replica, host, ids))

    async def get_endpoint(self, replica=None):
        self.asked.append(replica)
        if replica in self.dead:  # Serve still names it: its actor has not been reported dead yet
            return replica, ("127.0.0.1", dead_port()), b"token"
        name = replica if replica in self.replicas else next(iter(self.replicas))
        channel = self.replicas[name].channel
        return name, channel.address, channel.token


@pytest.fixture
def ran(monkeypatch) -> list:
    monkeypatch.setattr(live_replicas, "LIVE", {"drafter": ["r0", "r1"]})
    return []


def run(direct: DirectHandle, replica: str | None = None, method: str = "propose") -> list:
    return [r.value for r in asyncio.run(direct.run.remote(method, ["args"], None, replica=replica))]


def test_calls_run_on_the_named_replica_whose_channel_is_learnt_once(ran):
    serve = Serve(ran)
    direct = DirectHandle(serve, "drafter")

    async def calls():
        return [await direct.run.remote("propose", ["args"], None, replica=r) for r in ("r1", "r1", "r0")]

    assert [[r.value for r in replies] for replies in asyncio.run(calls())] == [["r1"], ["r1"], ["r0"]]
    assert serve.asked == ["r1", "r0"]
    assert ran == [("r1", "propose", ["args"])] * 2 + [("r0", "propose", ["args"])]


def test_a_dead_replica_raises_channel_closed_and_is_asked_for_again(ran):
    serve = Serve(ran)
    serve.dead.add("r0")
    direct = DirectHandle(serve, "drafter")
    with pytest.raises(ChannelClosed):
        run(direct, "r0")
    serve.dead.clear()
    del serve.replicas["r0"]
    assert run(direct, "r0") == ["r1"]  # Serve answers with a live replica; the executor re-places on its own
    assert serve.asked == ["r0", "r0"]


def test_a_stateless_deployment_takes_its_live_replicas_in_turn(ran):
    direct = DirectHandle(Serve(ran), "drafter")

    async def calls():
        return [(await direct.run.remote("propose", ["args"], None))[0].value for _ in range(4)]

    assert asyncio.run(calls()) == ["r0", "r1", "r0", "r1"]


def test_a_stateless_deployment_whose_live_replicas_are_unknown_asks_serve_once(ran, monkeypatch):
    monkeypatch.setattr(live_replicas, "LIVE", {})
    serve = Serve(ran)
    direct = DirectHandle(serve, "drafter")

    async def calls():
        return [(await direct.run.remote("propose", ["args"], None))[0].value for _ in range(3)]

    assert asyncio.run(calls()) == ["r0"] * 3 and serve.asked == [None]


async def released(ran: list) -> None:
    """Until the replica has run the release posted last (a post wants no reply)."""
    deadline = time.monotonic() + 10
    while ran[-1][1] != "release":
        assert time.monotonic() < deadline, "the release never reached the replica"
        await asyncio.sleep(0.01)


def test_kv_is_freed_over_the_replicas_channel_or_through_serve_before_one_is_known(ran):
    serve = Serve(ran)
    direct = DirectHandle(serve, "drafter")

    async def calls():
        direct.release.remote(["a"], replica="r0")
        await direct.run.remote("propose", ["args"], None, replica="r0")
        direct.release.remote(["b"], replica="r0")
        await released(ran)

    asyncio.run(calls())
    assert serve.released == [("r0", "drafter", ["a"])]
    assert ran[-1] == ("r0", "release", ["b"])


def test_a_call_on_an_open_channel_is_sent_before_start_returns(ran):
    """The replica has the frame while the loop that started the call is still busy: nothing that loop runs next
    delays it."""
    direct = DirectHandle(Serve(ran), "drafter")

    async def calls():
        await direct.run.remote("propose", ["first"], None, replica="r0")  # learns and opens the channel
        pending = direct.run.remote("propose", ["second"], None, replica="r0")
        deadline = time.monotonic() + 10
        while len(ran) < 2:  # blocks this loop: only a frame written already reaches the replica
            assert time.monotonic() < deadline, "the call was not sent until awaited"
            time.sleep(0.01)
        return await pending

    assert [r.value for r in asyncio.run(calls())] == ["r0"]
    assert [args for _, _, args in ran] == [["first"], ["second"]]


def test_a_hosts_error_fails_its_call_and_the_channel_goes_on(ran):
    direct = DirectHandle(Serve(ran), "drafter")

    async def calls():
        with pytest.raises(ValueError, match="bad draft on r0"):
            await direct.run.remote("verify", ["args"], None, replica="r0")
        return await direct.run.remote("propose", ["args"], None, replica="r0")

    assert [r.value for r in asyncio.run(calls())] == ["r0"]


def test_a_call_reports_the_replicas_kv_usage(ran):
    serve = Serve(ran)
    replica = serve.replicas["r0"]
    replica.kv = [SimpleNamespace(held=lambda: {"a": 3}), SimpleNamespace(held=lambda: {"a": 2, "b": 1})]
    replica.kv_budget = 16
    usage = replica.kv_usage = SimpleNamespace(value=None)
    usage.set = lambda value: setattr(usage, "value", value)
    assert run(DirectHandle(serve, "drafter"), "r0") == ["r0"]
    deadline = time.monotonic() + 10
    while usage.value is None:
        assert time.monotonic() < deadline, "the call never reported the replica's KV usage"
        time.sleep(0.01)
    assert usage.value == 0.375  # every host's KV on the replica


def test_each_hosts_calls_and_releases_reach_that_host_on_a_colocated_replica(ran):
    serve = Serve(ran)
    drafter, guider = DirectHandle(serve, "drafter"), DirectHandle(serve, "guider")

    async def calls():
        await guider.run.remote("propose", ["g"], None, replica="r0")
        await drafter.run.remote("propose", ["d"], None, replica="r0")
        guider.release.remote(["a"], replica="r0")
        await released(ran)

    asyncio.run(calls())
    assert ran == [("r0 guider", "propose", ["g"]), ("r0", "propose", ["d"]), ("r0 guider", "release", ["a"])]


def test_calls_that_learn_a_replicas_channel_at_once_share_one_connection(ran):
    """Two engines' first calls (an orchestrator that took over): both ask Serve, both run, over one connection."""
    serve = Serve(ran)
    asked = serve.get_endpoint

    async def slow_endpoint(replica=None):
        await asyncio.sleep(0.05)  # both calls ask before either hears back
        return await asked(replica)

    serve.endpoint = SimpleNamespace(remote=slow_endpoint)
    direct = DirectHandle(serve, "drafter")

    async def calls():
        return await asyncio.gather(*(direct.run.remote("propose", [i], None, replica="r0") for i in range(2)))

    assert [[r.value for r in replies] for replies in asyncio.run(calls())] == [["r0"], ["r0"]]
    assert len(serve.replicas["r0"].mirrors) == 1
