"""A request crosses to a replica whole once, then only what changed since (vLLM's NewRequestData, then
CachedRequestData).

Both ends of one channel connection (services/serving/channel.py) keep a copy per (host, request): the orchestrator's
`Sent` what it last sent, the replica's `Mirror` the request as it stands there. A call carries the difference
between the request now and what was sent: the canvas positions whose token or flags changed, the commits appended to
`order`, the scalars and the RNG's count of draws. Frames on a connection arrive and run in order, so both copies
advance together, frame by frame; a new connection (a replica restarted, a request moved) starts with none, and the
request crosses whole again.
A change that finds no mirror of the version it was made against (a mirror released, or any bug) fails the call with
OutOfSync before its host runs, and the orchestrator sends it again whole.

The sampling RNG is a seed and a count of draws (sampling.Rng): the seed crosses with the request whole, the count
with every change, so a host draws where the engine's RNG stands, and its reply says where its draws left it.

The replica's request lacks what pickling.ENGINE_ONLY leaves out, and after its first call the lists and clocks of its
stats (no host reads them): the counters follow.
"""

import copyreg
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from services.common.request import Request
from services.common.stats import COUNTERS
from services.serving.pickling import ForHost, names

SCALARS = ("horizon", "emitted", "finish_reason")
STAT_COUNTERS = ("rounds", "tokens", *COUNTERS)
scalars_of, counters_of = attrgetter(*SCALARS), attrgetter(*STAT_COUNTERS)
# a canvas position's state, one int64: its token, then three flags
DECIDED, FILLED, COMMITTED, FLAG_BITS = 1, 2, 4, 3


class OutOfSync(LookupError):
    """The replica's copy of a request is not the one a change was made against."""


@dataclass(slots=True)
class Whole:
    """A request the host has no copy of yet, and the version it starts at."""

    host: str
    version: int
    req: ForHost | Request  # the request as the host reads it on the way out, the request on arrival


@dataclass(slots=True)
class Changed:
    """What changed in a request since its version `base` reached the host."""

    host: str
    id: str
    base: int
    at: list[int]  # canvas positions whose token or flags changed
    states: list[int]  # their state (canvas_state)
    order_from: int  # order[order_from:] is new
    order_tail: list[int]
    scalars: tuple  # SCALARS
    counters: tuple[int, ...]  # STAT_COUNTERS
    draws: int  # the RNG's (Rng.draws)


@dataclass(slots=True)
class Shadow:
    req: Request  # the engine's request object this copies
    version: int
    states: np.ndarray  # [max_new_tokens] canvas_state as sent
    order: list[int]


def canvas_state(req: Request) -> np.ndarray:
    """[max_new_tokens] int64: each position's token << FLAG_BITS | DECIDED | FILLED | COMMITTED (numpy: on a
    canvas this short a torch op costs several times its numpy twin)."""
    decided, filled, committed = (t.numpy().view(np.uint8) for t in (req.decided, req.filled, req.committed))
    return (req.tokens.numpy() << FLAG_BITS) | decided | (filled << 1) | (committed << 2)


def with_request(args, req):
    """args with another `req` (dataclasses.replace, at a fifth of its cost)."""
    new = object.__new__(type(args))
    for name in names(type(args)):
        object.__setattr__(new, name, getattr(args, name))
    object.__setattr__(new, "req", req)
    return new


class Sent:
    """The orchestrator's end of one connection: what each host was last sent of each request."""

    def __init__(self):
        self.shadows: dict[tuple[str, str], Shadow] = {}

    def outgoing(self, host: str, args):
        """args with its request as this connection sends it: whole the first time, else what changed. Arguments
        without a request go as they are."""
        req = getattr(args, "req", None)
        if type(req) is not Request:
            return args
        return with_request(args, self.encode(host, req))

    def encode(self, host: str, req: Request) -> Whole | Changed:
        key, states = (host, req.id), canvas_state(req)
        shadow = self.shadows.get(key)
        if shadow is None or shadow.req is not req:  # first sent, or another request under a released id
            self.shadows[key] = Shadow(req, 0, states, list(req.order))
            return Whole(host, 0, ForHost(req))
        at = np.flatnonzero(states != shadow.states)
        n = len(shadow.order)
        start = n if req.order[:n] == shadow.order else 0
        tail = req.order[start:]
        change = Changed(
            host, req.id, shadow.version, at.tolist(), states[at].tolist(), start, tail, scalars_of(req),
            counters_of(req.stats), req.rng.draws,
        )  # fmt: skip
        shadow.version, shadow.states, shadow.order[start:] = shadow.version + 1, states, tail
        return change

    def forget(self, host: str, request_ids: list[str] | None = None) -> None:
        """Drop the host's copies of these requests (released), or all of them (the next call sends each whole)."""
        for key in [k for k in self.shadows if k[0] == host and (request_ids is None or k[1] in request_ids)]:
            del self.shadows[key]


class Mirror:
    """The replica's end of one connection: each host's copy of each request, as of the last call."""

    def __init__(self):
        self.requests: dict[tuple[str, str], tuple[int, Request]] = {}

    def incoming(self, args):
        """args as sent -> args with the request as it stands after the change it carries."""
        sent = getattr(args, "req", None)
        if type(sent) is Whole:
            self.requests[sent.host, sent.req.id] = (sent.version, sent.req)
            return with_request(args, sent.req)
        if type(sent) is Changed:
            return with_request(args, self.apply(sent))
        return args

    def apply(self, change: Changed) -> Request:
        version, req = self.requests.get((change.host, change.id), (None, None))
        if version != change.base:
            raise OutOfSync(f"{change.host} holds version {version} of request {change.id!r}, not {change.base}")
        if change.at:
            at, states = change.at, np.asarray(change.states)
            req.tokens.numpy()[at] = states >> FLAG_BITS
            req.decided.numpy()[at] = states & DECIDED
            req.filled.numpy()[at] = states & FILLED
            req.committed.numpy()[at] = states & COMMITTED
        del req.order[change.order_from :]
        req.order += change.order_tail
        for name, value in zip(SCALARS, change.scalars, strict=True):
            setattr(req, name, value)
        for name, value in zip(STAT_COUNTERS, change.counters, strict=True):
            setattr(req.stats, name, value)
        req.rng.draws = change.draws
        self.requests[change.host, change.id] = (change.base + 1, req)
        return req

    def forget(self, host: str, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.requests.pop((host, rid), None)


for cls in (Whole, Changed):  # as their fields, positionally: a slotted dataclass's own reduce goes through a dict
    copyreg.pickle(cls, lambda obj: (type(obj), tuple(getattr(obj, name) for name in names(type(obj)))))
