"""`dlm bench --breakdown` and the MFU of every load level, from each round's step timing
(services/orchestrator/engine/round_timing.py): in process from the engine's outputs, with `--target` from the
RoundTrace rows of each Complete. No torch here: the gRPC client imports it (the matmul reference is mfu.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from services.cli.load import LoadRow, stats_ms
from services.orchestrator.engine.round_timing import RoundTiming

if TYPE_CHECKING:
    from services.common.config import EngineConfig


@dataclass(slots=True)
class Work:
    """Model work of a level, each step counted once (a step's record is shared by its `requests` rounds)."""

    flops: dict[str, float]  # host -> model FLOPs
    tokens: dict[str, float]  # host -> decoder tokens
    calls: dict[str, float]  # host -> batched calls

    def busiest(self) -> str | None:
        """The host with the most model FLOPs: the reference matmul takes its shapes."""
        return max(self.flops, key=self.flops.get) if any(self.flops.values()) else None

    def tokens_per_call(self, host: str) -> int:
        return max(round(self.tokens[host] / max(self.calls[host], 1)), 1)


def work_of(timings: list[RoundTiming]) -> Work:
    out = Work({}, {}, {})
    for t in timings:
        for total, per_host in ((out.flops, t.flops), (out.tokens, t.tokens), (out.calls, t.calls)):
            for host, value in per_host.items():
                total[host] = total.get(host, 0.0) + value / t.requests
    return out


def from_trace(row) -> RoundTiming | None:
    """A RoundTrace message's timing; None for a round without one (the request ended without a step's round)."""
    if not row.requests:
        return None
    values = {f.name: getattr(row, f.name) for f in fields(RoundTiming)}
    return RoundTiming(**{k: dict(v) if hasattr(v, "items") else v for k, v in values.items()})


def parts(t: RoundTiming) -> dict[str, float]:
    """A round's parts, in seconds, in the order the table shows them."""
    out = {"round": t.round_s, "orchestrator": t.orchestrator_s, "hops": t.hops_s, "queue": t.queue_s}
    out["busy"] = t.busy_s
    out |= {f"compute {h}": s for h, s in sorted(t.compute_s.items())}
    out |= {f"cpu {h}": s for h, s in sorted(t.cpu_s.items())}
    out |= {f"idle {h}": s for h, s in sorted(t.idle_s().items())}
    return out | {"overlap": t.overlap_s}


def summary(timings: list[RoundTiming]) -> dict[str, dict[str, float]]:
    """part -> {median, p90, mean} in milliseconds over the level's rounds.

    round = orchestrator + hops + queue + busy."""
    columns: dict[str, list[float]] = {}
    for t in timings:
        for name, s in parts(t).items():
            columns.setdefault(name, []).append(s)
    return stats_ms(columns)


def finish_level(
    row: LoadRow, steps: list[RoundTiming], config: EngineConfig, breakdown: bool, run: Callable | None = None
) -> LoadRow:
    """A level's row with its MFU (run: where the forwards ran, mfu.measure), and with --breakdown its parts per
    round."""
    from services.cli.mfu import measure

    measure(row, steps, config, run)
    if breakdown and steps:
        row.breakdown = summary(steps)
    return row


def tables(rows: list[LoadRow]) -> str:
    lines = []
    for row in rows:
        for per, parts_ms in (("round", row.breakdown), ("request", row.per_request if row.breakdown else None)):
            if parts_ms:
                lines.append(f"{f'c={row.concurrency} per {per}, ms':<26} {'median':>8} {'p90':>8} {'mean':>8}")
                for name, v in parts_ms.items():
                    lines.append(f"  {name:<24} {v['median']:8.2f} {v['p90']:8.2f} {v['mean']:8.2f}")
    return "\n".join(lines)
