"""DirectHandle over a stand-in Serve handle and stand-in replica actors: a round's calls run on the named replica's own
actor, learnt once through Serve; a dead actor's error reaches the remote executor and the actor is asked for again;
a stateless deployment's calls take its live replicas in turn; KV is freed on the replica's actor."""

import asyncio
from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError

from services.common.contract import Reply
from services.serving import live_replicas, replica
from services.serving.direct import DirectHandle


class Actor:
    """A replica's actor: `__ray_call__` runs the closure on it, or raises as a dead actor does."""

    def __init__(self, name: str, ran: list):
        self.name, self.ran, self.dead = name, ran, False
        self.__ray_call__ = SimpleNamespace(remote=self.ray_call)

    def ray_call(self, fn, *args):
        if self.dead:
            raise ActorDiedError()
        self.ran.append((self.name, fn.__name__, *args))
        return Ref([Reply(self.name)])


class Ref:
    """An ObjectRef: awaiting it gives the reply; a fire-and-forget call never awaits it."""

    def __init__(self, value):
        self.value = value

    def __await__(self):
        yield from ()
        return self.value


class Serve:
    """A Serve handle: `actor` answers the replica named when it lives, else the first live one."""

    def __init__(self, ran: list):
        self.asked, self.released = [], []
        self.replicas = {name: Actor(name, ran) for name in ("r0", "r1")}
        self.actor = SimpleNamespace(remote=self.get_actor)
        self.release = SimpleNamespace(remote=lambda ids, replica=None: self.released.append((replica, ids)))
        self.deployment_name = "drafter"

    async def get_actor(self, replica=None):
        self.asked.append(replica)
        live = {name: a for name, a in self.replicas.items() if not a.dead}
        name = replica if replica in live else next(iter(live))
        return name, live[name]


@pytest.fixture
def ran(monkeypatch) -> list:
    monkeypatch.setattr(live_replicas, "LIVE", {"drafter": ["r0", "r1"]})
    return []


def run(direct: DirectHandle, replica: str | None = None) -> list:
    return [r.value for r in asyncio.run(direct.run.remote("propose", ["args"], None, replica=replica))]


def test_calls_run_on_the_named_replicas_actor_learnt_once(ran):
    serve = Serve(ran)
    direct = DirectHandle(serve)
    assert run(direct, "r1") == ["r1"] and run(direct, "r1") == ["r1"] and run(direct, "r0") == ["r0"]
    assert serve.asked == ["r1", "r0"]
    assert ran == [("r1", "direct", "propose", ["args"], None)] * 2 + [("r0", "direct", "propose", ["args"], None)]


def test_a_dead_actor_raises_and_is_asked_for_again(ran):
    serve = Serve(ran)
    direct = DirectHandle(serve)
    run(direct, "r0")
    serve.replicas["r0"].dead = True
    with pytest.raises(ActorDiedError):
        run(direct, "r0")
    assert run(direct, "r0") == ["r1"]  # Serve answers with a live replica; the executor re-places on its own
    assert serve.asked == ["r0", "r0"]


def test_a_stateless_deployment_takes_its_live_replicas_in_turn(ran):
    direct = DirectHandle(Serve(ran))
    assert [run(direct)[0] for _ in range(4)] == ["r0", "r1", "r0", "r1"]


def test_kv_is_freed_on_the_replicas_actor_or_through_serve_before_one_is_known(ran):
    serve = Serve(ran)
    direct = DirectHandle(serve)
    direct.release.remote(["a"], replica="r0")
    run(direct, "r0")
    direct.release.remote(["b"], replica="r0")
    assert serve.released == [("r0", ["a"])]
    assert ran[-1][:3] == ("r0", replica.direct_release.__name__, ["b"])
