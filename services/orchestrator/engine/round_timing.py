"""Where a round goes: a step (one round of every running request) split into the orchestrator's time, the hops to
the hosts and back, and each host's compute, from the `Compute` record each batched host call brings back
(services/common/compute.py). The same split in process, where the hops are the hand-off to the executor's thread,
and served, where they are the round trips to the replicas less what the replicas computed.

    round = orchestrator + hops + queue + busy  busy: time some host computes (per phase, the union of its calls)
    idle[host] = round - compute[host]          overlap: time at least two hosts compute at once
    cpu[host] <= compute[host]                  its thread on a core; a one-thread forward waited for one the rest

queue: time a call was out while its host's thread still ran an earlier call (served, another engine's micro-batch),
and no host computed for this step; hops: the rest of each phase, the round trips themselves. The round ends when its
last phase's values are delivered (the gate and commit included); the step's update after it (emitting the outputs,
which carry this record) is not in it.

Compute intervals are wall-clock times of the hosts' processes (one clock on one machine), clipped to the phase that
sent them, so a replica's clock that runs ahead or behind cannot make a hop negative."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the bench's gRPC client reads RoundTiming without torch
    from services.common.contract import Compute, Results


@dataclass(slots=True)
class RoundTiming:
    round_s: float
    orchestrator_s: float  # schedule, the stages' own work (region, gate, commit), grouping the calls
    hops_s: float  # each phase's wall time less the time a host computed or was busy before its call
    queue_s: float  # calls out, waiting for their host's thread to end an earlier call
    overlap_s: float  # time at least two hosts computed at once
    compute_s: dict[str, float]  # host -> time it computed for this step
    flops: dict[str, int] = field(default_factory=dict)  # host -> model FLOPs of its forwards
    tokens: dict[str, int] = field(default_factory=dict)  # host -> decoder tokens through its forwards
    calls: dict[str, int] = field(default_factory=dict)  # host -> batched calls
    requests: int = 1  # rounds in the step, which share this record
    cpu_s: dict[str, float] = field(default_factory=dict)  # host -> CPU time of its thread in its calls

    @property
    def busy_s(self) -> float:
        return self.round_s - self.orchestrator_s - self.hops_s - self.queue_s

    def idle_s(self) -> dict[str, float]:
        return {host: self.round_s - s for host, s in self.compute_s.items()}

    def attributes(self) -> dict[str, float | int]:
        """The round span's attributes (engine/telemetry.py)."""
        out: dict[str, float | int] = {
            "dlm.round_s": self.round_s,
            "dlm.orchestrator_s": self.orchestrator_s,
            "dlm.hops_s": self.hops_s,
            "dlm.queue_s": self.queue_s,
            "dlm.overlap_s": self.overlap_s,
        }
        idle = self.idle_s()
        for host, s in self.compute_s.items():
            out[f"dlm.compute_s.{host}"] = s
            out[f"dlm.idle_s.{host}"] = idle[host]
            out[f"dlm.flops.{host}"] = self.flops.get(host, 0)
            out[f"dlm.cpu_s.{host}"] = self.cpu_s.get(host, 0.0)
        return out


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        elif end > start:
            out.append((start, end))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def shared(per_host: list[list[tuple[float, float]]]) -> float:
    """Time covered by the intervals of at least two hosts (each host's own intervals disjoint)."""
    edges = sorted((t, d) for intervals in per_host for s, e in intervals for t, d in ((s, 1), (e, -1)))
    total, depth, last = 0.0, 0, 0.0
    for t, d in edges:
        if depth >= 2:
            total += t - last
        depth, last = depth + d, t
    return total


class StepClock:
    """Started when a step starts; told each phase's send and return; finished once its rounds are done."""

    def __init__(self):
        self.start = time.time()
        self.phases: list[tuple[float, float]] = []
        # each call once, with its compute and its wait for the host's thread, clipped to its phase; the phases
        # run one after another, so no two phases' intervals overlap
        self.computes: list[tuple[Compute, tuple[float, float], tuple[float, float]]] = []

    def phase(self, sent: float, back: float, results: Results) -> None:
        self.phases.append((sent, back))
        seen: set[int] = set()
        for replies in results.values():
            if isinstance(replies, BaseException):
                continue
            for reply in replies:
                c = reply.compute
                if c is not None and id(c) not in seen:
                    seen.add(id(c))
                    start, end = (min(max(t, sent), back) for t in (c.start, c.end))
                    self.computes.append((c, (start, end), (sent, min(max(c.free_since, sent), start))))

    def finish(self, requests: int, end: float | None = None) -> RoundTiming:
        """requests: the rounds the step ran; end: when it ended (default now)."""
        round_s = (end if end is not None else time.time()) - self.start
        phases = sum(back - sent for sent, back in self.phases)
        hosts = sorted({c.host for c, _, _ in self.computes})
        per_host = {h: union(span for c, span, _ in self.computes if c.host == h) for h in hosts}
        spans = [span for _, span, _ in self.computes]
        busy = length(union(spans))
        covered = length(union(spans + [wait for _, _, wait in self.computes]))
        flops, tokens, calls, cpu = Counter(), Counter(), Counter(), Counter()
        for c, _, _ in self.computes:
            flops[c.host] += c.flops
            tokens[c.host] += c.tokens
            calls[c.host] += 1
            cpu[c.host] += c.cpu
        return RoundTiming(
            round_s,
            round_s - phases,
            phases - covered,
            covered - busy,
            shared(list(per_host.values())),
            {h: length(per_host[h]) for h in hosts},
            dict(flops),
            dict(tokens),
            dict(calls),
            max(requests, 1),
            dict(cpu),
        )
