"""A request crosses to a replica whole once, then as what changed (services/serving/request_sync.py): through a
real pickle hop, after every kind of change a decode makes, the replica's copy equals the request as a whole hop
would bring it; a change is a fraction of the whole; a copy that is missing or a version behind fails with OutOfSync;
a released or replaced request crosses whole again; the RNG crosses as its count of draws.
Over a real channel (test_direct's stand-in replicas), a replica
that lost its copies still runs the call: the orchestrator sends the requests whole."""

import asyncio
import pickle

import pytest
import torch

from services.common.contract import Propose, Reply, Verify
from services.common.proposal import Region
from services.common.request import Request
from services.common.sampling import Rng, SamplingParams
from services.serving.direct import DirectHandle
from services.serving.request_sync import Changed, Mirror, OutOfSync, Sent, Whole
from tests.serving.test_direct import Serve, ran  # noqa: F401  the stand-in replicas and their fixture

FIELDS = ("id", "prompt_ids", "max_new_tokens", "mask_id", "eos_id", "sampling", "horizon", "order", "emitted", "rng")


def request(rid: str = "r", seed: float = 0.0) -> Request:
    return Request(rid, [5, 6, 7], 64, 1, 0, SamplingParams(temperature=seed, seed=11))


def hop(sent: Sent, mirror: Mirror, args, host: str = "drafter", kind: type = Changed) -> Request:
    """args through a pickle hop, its request crossing as `kind` -> the replica's copy."""
    out = sent.outgoing(host, args)
    assert type(out.req) is kind
    return mirror.incoming(pickle.loads(pickle.dumps(out))).req


def whole(args):
    """The request as a hop brought it whole (pickling.ForHost)."""
    return pickle.loads(pickle.dumps(args)).req


def assert_same(got: Request, want: Request) -> None:
    for name in FIELDS + ("finish_reason",):
        assert getattr(got, name) == getattr(want, name), name
    for name in ("tokens", "decided", "filled", "committed"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert (got.stats.rounds, got.stats.tokens, got.stats.drafter_forwards) == (
        want.stats.rounds,
        want.stats.tokens,
        want.stats.drafter_forwards,
    )


def changes(req: Request):
    """Each kind of change a decode makes, one after another."""
    req.tokens[0:4], req.filled[0:4] = torch.tensor([9, 8, 7, 6]), True  # tentative drafts kept as context
    yield
    req.decide(torch.tensor([0, 1]), torch.tensor([9, 8]))  # decided
    req.committed[0:2] = True
    req.order += [0, 1]  # committed in order
    req.stats.rounds += 1
    yield
    req.tokens[2], req.filled[3] = 4, False  # a draft replaced, one dropped
    req.tokens[3] = 1
    req.rng.generator()  # the engine draws (slots.py)
    yield
    req.order[:] = [1, 0]  # reordered (not an extension of what crossed)
    req.stats.drafter_forwards += 3
    req.stats.tokens += 2
    yield
    req.horizon, req.emitted, req.finish_reason = 40, 2, "eos"
    yield


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_every_change_reaches_the_replica_as_a_whole_hop_brings_it(temperature):
    req, sent, mirror = request(seed=temperature), Sent(), Mirror()
    propose, verify = Propose(req, Region(0, 16), False, True), Verify(req, 0, torch.tensor([3]), 1)
    assert_same(hop(sent, mirror, propose, kind=Whole), whole(propose))
    for _ in changes(req):
        for args in (propose, verify):
            assert_same(hop(sent, mirror, args), whole(args))


def test_the_rng_crosses_as_its_count_of_draws():
    """A seeded request's change is no larger than a greedy one's: the seed crossed whole, the count follows."""
    req, sent, mirror = request(seed=0.7), Sent(), Mirror()
    propose = Propose(req, Region(0, 16))
    copy = hop(sent, mirror, propose, kind=Whole)
    copy.rng.generator()  # the host draws there; its reply says how many draws that leaves
    req.rng.draws = copy.rng.draws
    req.rng.generator()  # the engine draws too (slots.py)
    assert hop(sent, mirror, propose).rng == Rng(11, 2)
    greedy, greedy_sent = request(), Sent()
    for r, s in ((req, sent), (greedy, greedy_sent)):
        r.rng.draws = 12345
        s.outgoing("drafter", Propose(r, Region(0, 16)))
    sizes = [
        len(pickle.dumps(s.outgoing("drafter", Propose(r, Region(0, 16)))))
        for r, s in ((req, sent), (greedy, greedy_sent))
    ]
    assert sizes[0] == sizes[1]


def test_a_change_is_a_fraction_of_the_whole_request():
    req, sent = Request("r" * 36, list(range(200)), 256, 1, 0), Sent()
    first = pickle.dumps(sent.outgoing("drafter", Propose(req, Region(0, 16))))
    req.decide(torch.arange(8), torch.arange(8) + 5)
    req.order += list(range(8))
    change = pickle.dumps(sent.outgoing("drafter", Propose(req, Region(8, 24))))
    assert len(change) * 5 < len(first)


def test_a_missing_or_skipped_copy_is_out_of_sync():
    req, sent, mirror = request(), Sent(), Mirror()
    args = Propose(req, Region(0, 16))
    hop(sent, mirror, args, kind=Whole)
    sent.outgoing("drafter", args)  # a change the replica never got
    with pytest.raises(OutOfSync, match="version 0 of request 'r', not 1"):
        hop(sent, mirror, args)
    with pytest.raises(OutOfSync, match="version None of request 'r'"):
        hop(sent, Mirror(), args)


def test_a_released_or_replaced_request_crosses_whole_again():
    req, sent, mirror = request(), Sent(), Mirror()
    args = Propose(req, Region(0, 16))
    hop(sent, mirror, args, kind=Whole)
    sent.forget("drafter", ["r"])
    mirror.forget("drafter", ["r"])
    assert type(sent.outgoing("drafter", args).req) is Whole
    assert type(sent.outgoing("guider", args).req) is Whole  # each host its own copy
    assert type(sent.outgoing("drafter", Propose(request(), Region(0, 16))).req) is Whole  # a new request, same id


def test_a_replica_that_lost_its_copies_still_runs_the_call(ran):  # noqa: F811
    serve = Serve(ran)
    direct = DirectHandle(serve, "drafter")
    req = request()

    async def calls():
        seen = []
        for start, cleared in ((0, False), (1, False), (2, True)):
            if start:
                req.decide(torch.tensor([start - 1]), torch.tensor([10 - start]))
            if cleared:
                serve.replicas["r0"].mirrors[0].requests.clear()
            await direct.run.remote("propose", [Propose(req, Region(start, 16))], None, replica="r0")
            seen.append(ran[-1][2][0].req.tokens[:2].tolist())  # the request as the host had it
        return seen

    assert asyncio.run(calls()) == [[1, 1], [9, 1], [9, 8]]
    assert len(ran) == 3  # the call out of sync ran once, whole
    assert type(direct.channels["r0"].session.outgoing("drafter", Propose(req, Region(2, 16))).req) is Changed


def test_a_request_whose_call_failed_crosses_whole_next(ran):  # noqa: F811
    """What its host made of its copy before failing is unknown."""
    direct = DirectHandle(Serve(ran), "drafter")
    req = request(seed=0.7)

    async def calls():
        await direct.run.remote("propose", [Propose(req, Region(0, 16))], None, replica="r0")
        with pytest.raises(ValueError, match="bad draft"):
            await direct.run.remote("verify", [Verify(req, 0, torch.tensor([3]), 1)], None, replica="r0")

    asyncio.run(calls())
    assert type(direct.channels["r0"].session.outgoing("drafter", Propose(req, Region(0, 16))).req) is Whole


class Drawing:
    """A drafter host that draws from each request's RNG, as a seeded proposal does."""

    def __init__(self):
        self.drawn = []

    def propose(self, args: list) -> list[Reply]:
        self.drawn += [torch.rand(1, generator=call.req.rng.generator()).item() for call in args]
        return [Reply(None, 0, call.req.rng.draws) for call in args]


def test_draws_on_the_replica_go_on_from_its_copy_of_the_rng_as_in_process(ran):  # noqa: F811
    serve = Serve(ran)
    host = serve.replicas["r0"].hosts["drafter"] = Drawing()
    direct = DirectHandle(serve, "drafter")
    req = request(seed=0.7)

    async def calls():
        for _ in range(3):
            (reply,) = await direct.run.remote("propose", [Propose(req, Region(0, 16))], None, replica="r0")
            req.rng.draws = reply.draws  # as the engine takes it (engine/rounds.py: account)

    asyncio.run(calls())
    in_process = Rng(11)
    assert host.drawn == [torch.rand(1, generator=in_process.generator()).item() for _ in range(3)]
    assert req.rng == in_process
