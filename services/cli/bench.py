"""`dlm bench`: every strategy and the AR baseline on the same prompts in one process."""

import time
from dataclasses import dataclass

from services.common.params import BENCH_PROMPTS as PROMPTS
from services.common.sampling import SamplingParams
from services.orchestrator.engine import Engine


@dataclass(slots=True)
class BenchRow:
    strategy: str
    tokens: int
    wall_s: float
    rounds: int
    drafter_tokens: int
    tokens_per_s: float = 0.0
    tpf: float = 0.0
    p_cache: float = 0.0
    speedup_vs_ar: float | None = None
    speedup_vs_mdm: float | None = None
    ms_per_round: float = 0.0


def run_strategy(engine: Engine, strategy: str, prompts: list[str], max_new_tokens: int, params: dict) -> BenchRow:
    row = BenchRow(strategy, 0, 0.0, 0, 0)
    for prompt in prompts:
        start = time.perf_counter()
        result = engine.generate(prompt, strategy, params, max_new_tokens, SamplingParams())
        row.wall_s += time.perf_counter() - start
        row.tokens += result.stats["tokens"]
        row.rounds += result.stats["rounds"]
        row.drafter_tokens += result.stats["drafter_tokens_processed"]
    row.tokens_per_s = row.tokens / row.wall_s
    row.tpf = row.tokens / max(row.rounds, 1)
    row.p_cache = row.tokens / row.drafter_tokens if row.drafter_tokens else 1.0
    row.ms_per_round = 1000 * row.wall_s / max(row.rounds, 1)
    return row


def bench(
    engine: Engine,
    strategies: list[str],
    prompts: list[str] | None = None,
    max_new_tokens: int = 64,
    params: dict[str, dict] | None = None,
) -> list[BenchRow]:
    prompts = prompts or PROMPTS
    names = list(dict.fromkeys(["ar", "mdm", *strategies]))
    engine.generate(prompts[0], "ar", None, 4)  # load weights and warm up outside the timings
    rows = [run_strategy(engine, name, prompts, max_new_tokens, (params or {}).get(name, {})) for name in names]
    base = {row.strategy: row.tokens_per_s for row in rows}
    for row in rows:
        row.speedup_vs_ar = row.tokens_per_s / base["ar"]
        row.speedup_vs_mdm = row.tokens_per_s / base["mdm"]
    return rows


def table(rows: list[BenchRow]) -> str:
    names = ("tok/s", "TPF", "p_cache", "vs ar", "vs mdm", "ms/rnd", "tokens")
    lines = [f"{'strategy':<13} " + " ".join(f"{n:>8}" for n in names)]
    for r in rows:
        lines.append(
            f"{r.strategy:<13} {r.tokens_per_s:>8.1f} {r.tpf:>8.2f} {r.p_cache:>8.3f} "
            f"{r.speedup_vs_ar:>7.2f}x {r.speedup_vs_mdm:>7.2f}x {r.ms_per_round:>8.1f} {r.tokens:>8}"
        )
    return "\n".join(lines)
