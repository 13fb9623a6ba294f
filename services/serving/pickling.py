"""Cheap pickling for what crosses a Serve hop: tensors go as numpy arrays, about ten times faster than torch's own
reduce, and the orchestrator pays it on every call of every round.

Importing this module registers the reducers in copyreg's dispatch table, which pickle, copy and Ray's cloudpickle
consult before a class's own reduce; every module that sends these classes across a hop imports it. The classes
themselves stay plain slotted dataclasses of services/common, which knows nothing of serving. A call's request
crosses without what only the engine reads; its RNG is two ints (sampling.Rng).
"""

import copyreg
from dataclasses import fields
from functools import cache
from typing import get_args

import numpy as np
import torch

from services.common.contract import Args, Guessed, Reply
from services.common.proposal import Decision, Proposal, TokenLogprobs, Verdict
from services.common.request import Request
from services.common.sampling import Rng


class _Array:
    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array


def pack(value):
    if type(value) is torch.Tensor and value.device.type == "cpu":  # exact type: isinstance costs more
        return _Array(value.numpy())
    return value


def unpack(value):
    return torch.from_numpy(value.array) if type(value) is _Array else value


def restore(cls: type, state: dict):
    obj = object.__new__(cls)
    for name, value in state.items():
        object.__setattr__(obj, name, unpack(value))
    return obj


@cache
def names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names: dataclasses.fields builds its tuple anew at every call."""
    return tuple(f.name for f in fields(cls))


def reduce(obj) -> tuple:
    return restore, (type(obj), {name: pack(getattr(obj, name)) for name in names(type(obj))})


# A request's fields that no host reads, and that grow: the strategy's state (credit's [block, V] scores, 0.8 MB a
# request in each call) and the logprobs of every token so far, when the request asks for them.
ENGINE_ONLY = ("state", "logprobs")


class ForHost:
    """A call's request as its host reads it: without ENGINE_ONLY."""

    __slots__ = ("req",)

    def __init__(self, req: Request):
        self.req = req


def reduce_request(req: Request, skip: tuple[str, ...] = ()) -> tuple:
    """As reduce; the skipped fields arrive empty, as a new request has them."""
    state = {name: pack(getattr(req, name)) for name in names(Request) if name not in skip}
    state |= {name: {} for name in skip}
    return restore, (Request, state)


def reduce_args(args: Args) -> tuple:
    state = {name: pack(getattr(args, name)) for name in names(type(args))}
    if type(state.get("req")) is Request:  # else what request_sync.py sends in its place
        state["req"] = ForHost(args.req)
    return restore, (type(args), state)


FLAT = ("positions", "ids", "probs", "entropy")  # a proposal's [N] tensors


def reduce_guessed(guessed: Guessed) -> tuple:
    """Overlap's guesses as four flat arrays and the lengths that split them: one object per proposal cost 1.1 ms to
    pickle and 0.6 to unpickle at 16 guesses (9 KB), as many as a round's other calls together. A proposal with
    logprobs (a request that asks for them) goes whole."""
    proposals = guessed.proposals
    if any(p.logits is not None or p.logprobs is not None for p in proposals):
        return reduce(guessed)
    flat = [torch.cat([getattr(p, name) for p in proposals]).numpy() for name in FLAT]
    return restore_guessed, ([len(p.ids) for p in proposals], guessed.draws, *flat)


def restore_guessed(lengths: list[int], draws: int, *flat: np.ndarray) -> Guessed:
    split = [torch.from_numpy(array).split(lengths) for array in flat]
    return Guessed([Proposal(*tensors, logits=None) for tensors in zip(*split, strict=True)], draws)


# what the stages send across a hop, and what the hosts send back
for cls in (Proposal, Verdict, Decision, Reply, TokenLogprobs):
    copyreg.pickle(cls, reduce)
for cls in get_args(Args):
    copyreg.pickle(cls, reduce_args)
copyreg.pickle(Guessed, reduce_guessed)
copyreg.pickle(Request, reduce_request)  # whole: the cache index's record of a request (cluster/admission.py)
copyreg.pickle(ForHost, lambda view: reduce_request(view.req, ENGINE_ONLY))
copyreg.pickle(Rng, lambda rng: (Rng, (rng.seed, rng.draws)))
