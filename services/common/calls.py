"""What a round asks of the models. A stage is a generator: it yields the Calls it needs next and receives their
values. The engine runs the calls of every live request that name the same (role, method) as one batched call to
that role's host, so a step costs one model call per stage however many requests share it."""

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")
Stage = Generator[list["Call"], list[Any], T]  # yields calls, receives their values in order, returns T


@dataclass(frozen=True, slots=True)
class Call:
    role: str  # the host: drafter, guider, ar, drafter_ar (AR decoding on the causal drafter), filter
    method: str  # a batched method of that host: a list of args -> a list of Reply
    args: tuple  # one request's arguments; for model calls args[0] is the Request


@dataclass(slots=True)
class Reply:
    value: Any
    tokens: int = 0  # token instances the call ran through the model for this request (p_cache's N_fwd)
    generator: torch.Generator | None = None  # the request's sampling RNG after the call (a remote host ran a copy)


def no_calls() -> Stage[None]:
    """A stage that needs no model this round."""
    return
    yield
