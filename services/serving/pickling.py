"""Cheap pickling for what crosses a Serve hop: tensors go as numpy arrays and generators as their state,
about ten times faster than torch's own reduce, and the orchestrator pays it on every call of every round.

Importing this module registers the reducers in copyreg's dispatch table, which pickle, copy and Ray's cloudpickle
consult before a class's own reduce; every module that sends these classes across a hop imports it. The classes
themselves stay plain slotted dataclasses of services/common, which knows nothing of serving. A request's RNG
crosses only with a call whose host samples from it.
"""

import copyreg
from dataclasses import fields
from functools import cache
from typing import get_args

import numpy as np
import torch

from services.common.contract import Args, Propose, ProposeBidirectional, Reply
from services.common.proposal import Decision, Proposal, TokenLogprobs, Verdict
from services.common.request import Request


class _Array:
    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array


class _Generator:
    __slots__ = ("state",)

    def __init__(self, state: np.ndarray):
        self.state = state


def pack(value):
    # exact types: isinstance(value, torch.Generator) runs a Python __instancecheck__, a third of a request's pickling
    kind = type(value)
    if kind is torch.Tensor and value.device.type == "cpu":
        return _Array(value.numpy())
    if kind is torch.Generator and value.device.type == "cpu":
        return _Generator(value.get_state().numpy())
    return value


def unpack(value):
    kind = type(value)
    if kind is _Array:
        return torch.from_numpy(value.array)
    if kind is _Generator:
        generator = torch.Generator()
        generator.set_state(torch.from_numpy(value.state))
        return generator
    return value


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


class _WithoutRNG:
    """A call's request that crosses without its RNG: its host draws nothing from it."""

    __slots__ = ("req",)

    def __init__(self, req: Request):
        self.req = req


def reduce_request(req: Request, rng: bool = True) -> tuple:
    """As reduce, but the RNG crosses only to a host that draws from it (a proposal's sampling, sampling.choose) and
    never for a greedy request: its state is 5 KB, most of what a round sends (scripts/hop_bytes.py); the host's Reply
    then brings none back."""
    state = {name: pack(getattr(req, name)) for name in names(Request) if name != "generator"}
    state["generator"] = pack(req.generator) if rng and not req.sampling.greedy else None
    return restore, (Request, state)


def reduce_args(args: Args) -> tuple:
    state = {name: pack(getattr(args, name)) for name in names(type(args))}
    if "req" in state and not isinstance(args, DRAWS):
        state["req"] = _WithoutRNG(args.req)
    return restore, (type(args), state)


DRAWS = (Propose, ProposeBidirectional)  # the calls whose host samples from the request's RNG

# what the stages send across a hop, and what the hosts send back
for cls in (Proposal, Verdict, Decision, Reply, TokenLogprobs):
    copyreg.pickle(cls, reduce)
for cls in get_args(Args):
    copyreg.pickle(cls, reduce_args)
copyreg.pickle(Request, reduce_request)
copyreg.pickle(_WithoutRNG, lambda without: reduce_request(without.req, rng=False))
