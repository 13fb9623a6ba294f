"""`dlm bench`: every strategy and the baselines on the same prompts in one process. Baselines: `ar` (ar-base, the
same-size AR model: FlashDLM Table 4's comparison), `ar-drafter` (the causal drafter's own decode, left to right and
KV-cached: what `guided` and `pipeline` weigh against with follow=drafter, their default), `ar-guider` (the guider
alone, whose output they reproduce with follow=guider) and `mdm` (the bidirectional drafter's own decode)."""

import time
from dataclasses import dataclass

from services.common.params import BENCH_PROMPTS as PROMPTS
from services.common.sampling import SamplingParams
from services.orchestrator.engine.engine import Engine

# bench row name -> (strategy, params)
BASELINES = {
    "ar": ("ar", {}),
    "ar-drafter": ("ar", {"model": "drafter"}),
    "ar-guider": ("ar", {"model": "guider"}),
    "mdm": ("mdm", {}),
}
OPTIONAL = {"ar-drafter": "drafter", "ar-guider": "guider"}  # rows that need a configured role


@dataclass(slots=True)
class BenchRow:
    strategy: str
    tokens: int
    wall_s: float
    rounds: int
    drafter_tokens: int
    model_forwards: int = 0
    tokens_per_s: float = 0.0
    tpf: float = 0.0
    tokens_per_forward: float = 0.0
    p_cache: float = 0.0
    speedup_vs_ar: float | None = None
    speedup_vs_ar_drafter: float | None = None
    speedup_vs_ar_guider: float | None = None
    speedup_vs_mdm: float | None = None
    ms_per_round: float = 0.0


def run_strategy(
    engine: Engine, name: str, prompts: list[str], max_new_tokens: int, params: dict, strategy: str | None = None
) -> BenchRow:
    """One row named `name`, decoded by `strategy` (default: the name)."""
    row = BenchRow(name, 0, 0.0, 0, 0)
    for prompt in prompts:
        start = time.perf_counter()
        result = engine.generate(prompt, strategy or name, params, max_new_tokens, SamplingParams())
        row.wall_s += time.perf_counter() - start
        row.tokens += result.stats["tokens"]
        row.rounds += result.stats["rounds"]
        row.model_forwards += result.stats["model_forwards"]
        row.drafter_tokens += result.stats["drafter_tokens_processed"]
    row.tokens_per_s = row.tokens / row.wall_s
    row.tpf = row.tokens / max(row.rounds, 1)
    row.tokens_per_forward = row.tokens / max(row.model_forwards, 1)
    row.p_cache = row.tokens / row.drafter_tokens if row.drafter_tokens else 1.0
    row.ms_per_round = 1000 * row.wall_s / max(row.rounds, 1)
    return row


def warm_run(
    engine: Engine, name: str, prompts: list[str], max_new_tokens: int, params: dict, strategy: str | None
) -> BenchRow:
    """The row's run, right after one untimed request of its own. A model and code left untouched for a while are
    slow to touch again here: on the 2-core box the drafter's first forward after 3.5 s idle took 140 ms against 6,
    and five `pipeline` requests took 146-173 ms right after `mdm` against 110-125 after `pipeline`. Each row follows
    the others, so without the warm-up a row's time held part of the cost of following the row before it."""
    engine.generate(prompts[0], strategy or name, params, max_new_tokens, SamplingParams())
    return run_strategy(engine, name, prompts, max_new_tokens, params, strategy)


def baselines(engine: Engine) -> dict[str, tuple[str, dict]]:
    """The drafter-alone and guider-alone rows only where that model is configured."""
    return {k: v for k, v in BASELINES.items() if k not in OPTIONAL or OPTIONAL[k] in engine.config.models}


def bench(
    engine: Engine,
    strategies: list[str],
    prompts: list[str] | None = None,
    max_new_tokens: int = 64,
    params: dict[str, dict] | None = None,
    repeats: int = 1,
) -> list[BenchRow]:
    """repeats: the rows take turns this many times and each keeps its median run, so that a slow spell of a shared
    machine falls on every row alike rather than on one (a speedup from single runs ranged 1.85-3.62x on 2 cores)."""
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    prompts = prompts or PROMPTS
    runs = baselines(engine) | {s: (s, (params or {}).get(s, {})) for s in strategies if s not in BASELINES}
    turns = [
        [warm_run(engine, name, prompts, max_new_tokens, p, strategy) for name, (strategy, p) in runs.items()]
        for _ in range(repeats)
    ]
    rows = [median_run(list(runs_of_row)) for runs_of_row in zip(*turns, strict=True)]
    base = {row.strategy: row.tokens_per_s for row in rows}
    for row in rows:
        row.speedup_vs_ar = row.tokens_per_s / base["ar"]
        row.speedup_vs_mdm = row.tokens_per_s / base["mdm"]
        if "ar-drafter" in base:
            row.speedup_vs_ar_drafter = row.tokens_per_s / base["ar-drafter"]
        if "ar-guider" in base:
            row.speedup_vs_ar_guider = row.tokens_per_s / base["ar-guider"]
    return rows


def median_run(runs: list[BenchRow]) -> BenchRow:
    return sorted(runs, key=lambda row: row.tokens_per_s)[len(runs) // 2]


def speedup(value: float | None) -> str:
    return f"{value:>9.2f}x" if value is not None else f"{'-':>10}"


def table(rows: list[BenchRow]) -> str:
    names = ("tok/s", "TPF", "tok/fwd", "p_cache", "vs ar", "vs drafter", "vs guider", "vs mdm", "ms/rnd", "tokens")
    lines = [f"{'strategy':<13} " + " ".join(f"{n:>10}" for n in names)]
    for r in rows:
        lines.append(
            f"{r.strategy:<13} {r.tokens_per_s:>10.1f} {r.tpf:>10.2f} {r.tokens_per_forward:>10.2f} {r.p_cache:>10.3f} "
            f"{speedup(r.speedup_vs_ar)} {speedup(r.speedup_vs_ar_drafter)} {speedup(r.speedup_vs_ar_guider)} "
            f"{speedup(r.speedup_vs_mdm)} {r.ms_per_round:>10.1f} {r.tokens:>10}"
        )
    return "\n".join(lines)
