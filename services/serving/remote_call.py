"""A stage call that crosses a process boundary runs on a copy of the request; these carry its effects back."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from services.common.request import Request
from services.serving.pickling import compact


@compact
@dataclass(slots=True)
class Reply:
    value: Any
    counters: dict[str, int]  # stat counters the call added
    generator: torch.Generator  # the sampling RNG after the call


def run_batch(fn: Callable[[list[tuple]], list], calls: list[tuple]) -> list[Reply]:
    """Replica side: run a batched stage function on request copies (each call's first item is its request)."""
    before = [call[0].stats.counters() for call in calls]
    values = fn(calls)
    return [
        Reply(value, {k: call[0].stats.counters()[k] - b[k] for k in b}, call[0].generator)
        for value, call, b in zip(values, calls, before, strict=True)
    ]


def absorb(req: Request, reply: Reply) -> Any:
    """Orchestrator side: apply a reply's effects to the live request and return its value."""
    req.stats.add(reply.counters)
    req.generator = reply.generator
    return reply.value


def regroup(flat: list, groups: list[list]) -> list[list]:
    """Cut a flat list of results back into the callers' groups."""
    out, start = [], 0
    for group in groups:
        out.append(flat[start : start + len(group)])
        start += len(group)
    return out


def run_groups(fn: Callable[[list[tuple]], list], groups: list[list[tuple]]) -> list[list[Reply]]:
    """Replica side of @serve.batch over client-side batches: every caller's list in one call of fn."""
    return regroup(run_batch(fn, [call for group in groups for call in group]), groups)
