"""Load levels: `concurrency` requests kept in flight over the prompt set, the same row whether the requests go to
a server over gRPC (`dlm bench --target`) or to the in-process engine (`dlm bench --concurrency` alone)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a gRPC client of this module never imports torch
    from services.orchestrator.engine.engine import Engine
    from services.orchestrator.engine.round_timing import RoundTiming


@dataclass(slots=True)
class LoadRow:
    concurrency: int
    requests: int
    tokens: int
    wall_s: float
    tokens_per_s: float  # aggregate over every stream
    requests_per_s: float
    latency_p50_s: float
    latency_p90_s: float
    latency_p99_s: float
    ttft_mean_s: float  # request sent -> first text
    ms_per_round: float  # latency over the engine's rounds: compare served with in-process
    tpf: float
    model_gflops_per_s: float = 0.0  # model FLOPs of the forwards run (services/common/flops.py) over wall time
    matmul_gflops_per_s: float = 0.0  # torch's matmul on the busiest model's shapes, here, in this run (mfu.py)
    mfu: float = 0.0  # the first over the second
    matmul_shape: str = ""
    breakdown: dict | None = None  # part -> {median, p90, mean} ms per round (dlm bench --breakdown)
    per_request: dict | None = None  # part -> {median, p90, mean} ms per request (printed by --breakdown)


@dataclass(slots=True)
class Timing:
    """One request as its client saw it."""

    latency_s: float
    ttft_s: float
    tokens: int
    rounds: int
    rounds_s: float = 0.0  # the wall time of the steps that ran its rounds
    before_s: float = 0.0  # from its arrival at the engine to the start of the step that ran its first round
    served_s: float = 0.0  # from its arrival at the engine to its last output


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def stats_ms(columns: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """name -> values in seconds  ->  name -> {median, p90, mean} in milliseconds."""
    return {
        name: {
            "median": 1000 * statistics.median(v),
            "p90": 1000 * percentile(v, 0.9),
            "mean": 1000 * statistics.fmean(v),
        }
        for name, v in columns.items()
    }


def per_request(timings: list[Timing]) -> dict[str, dict[str, float]]:
    """A request's latency as its client saw it, split into its rounds and the rest, which is: before its first
    round (admission, the cache index's reservation, the step in progress when it came), between its rounds (each
    step's update after its round; steps that did not run it), and its way in and out (on a server, gRPC before the
    engine had it and the final messages after its last output; in process, nothing)."""
    return stats_ms(
        {
            "latency": [t.latency_s for t in timings],
            "in rounds": [t.rounds_s for t in timings],
            "outside rounds": [t.latency_s - t.rounds_s for t in timings],
            "before first round": [t.before_s for t in timings],
            "between rounds": [t.served_s - t.before_s - t.rounds_s for t in timings],
            "way in and out": [t.latency_s - t.served_s for t in timings],
        }
    )


def work(prompts: list[str], concurrency: int, repeats: int = 8) -> list[str]:
    """The prompts sent at one level: each at least `repeats` times, and `repeats` per stream, so that a level's wall
    time is its steady state rather than its ramp-down (the last long requests running nearly alone): with 2 per
    stream, served c=16 read 369 tok/s where 8 per stream read 469."""
    return [prompts[i % len(prompts)] for i in range(max(concurrency, len(prompts)) * repeats)]


def load_row(concurrency: int, timings: list[Timing], wall_s: float) -> LoadRow:
    latencies = [t.latency_s for t in timings]
    tokens, rounds = sum(t.tokens for t in timings), sum(t.rounds for t in timings)
    return LoadRow(
        concurrency,
        len(timings),
        tokens,
        wall_s,
        tokens / wall_s,
        len(timings) / wall_s,
        percentile(latencies, 0.5),
        percentile(latencies, 0.9),
        percentile(latencies, 0.99),
        statistics.fmean(t.ttft_s for t in timings),
        1000 * sum(latencies) / max(rounds, 1),
        tokens / max(rounds, 1),
        per_request=per_request(timings),
    )


def table(rows: list[LoadRow]) -> str:
    head = ("conc", "reqs", "tok/s", "req/s", "p50 s", "p90 s", "p99 s", "ttft s", "ms/rnd", "TPF", "GFLOP/s", "MFU")
    lines = [" ".join(f"{h:>7}" for h in head)]
    for r in rows:
        lines.append(
            f"{r.concurrency:>7} {r.requests:>7} {r.tokens_per_s:>7.1f} {r.requests_per_s:>7.2f} "
            f"{r.latency_p50_s:>7.3f} {r.latency_p90_s:>7.3f} {r.latency_p99_s:>7.3f} {r.ttft_mean_s:>7.3f} "
            f"{r.ms_per_round:>7.1f} {r.tpf:>7.2f} {r.model_gflops_per_s:>7.2f} {r.mfu:>7.1%}"
        )
    lines += [
        f"c={r.concurrency} MFU: model {r.model_gflops_per_s:.2f} GFLOP/s over matmul {r.matmul_shape} "
        f"{r.matmul_gflops_per_s:.1f} GFLOP/s"
        for r in rows
        if r.matmul_gflops_per_s
    ]
    return "\n".join(lines)


def levels(spec: str) -> list[int]:
    out = [int(c) for c in str(spec).split(",") if c]
    if not out or min(out) < 1:
        raise ValueError(f"--concurrency expects positive integers like 1,4,16, got {spec!r}")
    return out


def engine_level(
    engine: Engine, concurrency: int, prompts: list[str], strategy: str | None, params: dict, max_new_tokens: int
) -> tuple[LoadRow, list[RoundTiming]]:
    """Closed loop on the in-process engine: whenever a request ends, the next prompt takes its place. -> the row,
    and each round's step timing."""
    from services.common.sampling import SamplingParams

    queue, live, timings, steps = list(reversed(work(prompts, concurrency))), {}, [], []
    stepped: dict[str, float] = {}  # request id -> wall time of the steps that ran its rounds
    before: dict[str, float] = {}  # request id -> from its arrival to the start of its first round's step
    start = time.perf_counter()
    while queue or live:
        while queue and len(live) < concurrency:
            req = engine.add_request(queue.pop(), strategy, params, max_new_tokens, SamplingParams())
            live[req.id] = req
        for out in engine.step():
            if out.timing is not None and out.request_id in live:
                steps.append(out.timing)
                stepped[out.request_id] = stepped.get(out.request_id, 0.0) + out.timing.round_s
                before.setdefault(out.request_id, out.elapsed_s - out.timing.round_s)
            req = live.get(out.request_id)
            if req is not None and out.finish_reason is not None:
                if out.error is not None:
                    raise out.error
                stats = live.pop(out.request_id).stats
                end = stats.end_s or time.perf_counter()
                first = stats.first_commit_s or end
                rounds_s, waited = stepped.pop(out.request_id, 0.0), before.pop(out.request_id, 0.0)
                latency, ttft = end - stats.start_s, first - stats.start_s
                timings.append(Timing(latency, ttft, stats.tokens, stats.rounds, rounds_s, waited, out.elapsed_s))
    return load_row(concurrency, timings, time.perf_counter() - start), steps
