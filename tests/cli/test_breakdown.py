"""`dlm bench --breakdown` and MFU: a step's parts from its phases and its hosts' compute, and in process the parts
of every round add up to the round, and the rounds to the level's wall time."""

import json
import threading
from dataclasses import replace

import pytest
import torch

from services.cli import mfu
from services.cli.breakdown import summary
from services.cli.cli import main
from services.cli.load import engine_level
from services.cli.mfu import on_threads
from services.common.config import EngineConfig
from services.common.contract import Compute, Reply
from services.common.threads import DEFAULT_THREADS
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.local_executor import LocalExecutor
from services.orchestrator.engine.round_timing import StepClock
from tests.cli.test_cli import write_config

PROMPTS = ["count from 1 to 9:", "copy: a b c", "reverse: a b c d"]


def replies(*computes: Compute, n: int = 2) -> list[Reply]:
    """A batched call's replies: every one carries its call's Compute."""
    out = []
    for c in computes:
        out += [Reply(None, compute=c) for _ in range(n)]
    return out


def test_a_step_splits_into_orchestrator_hops_queue_compute_and_overlap():
    clock = StepClock()
    clock.start = 100.0
    # sent at 100.1, the drafter's thread ended an earlier call at 100.2 and this one ran 100.25-100.4
    drafter = Compute("drafter", 100.25, 100.4, 30, 3, free_since=100.2, cpu=0.1)
    clock.phase(100.1, 100.5, {("drafter", "propose"): replies(drafter)})
    # the guider's clock runs behind: its start is clipped to the phase's
    guider, filter_ = Compute("guider", 100.55, 100.9, 20, 2, cpu=0.2), Compute("filter", 100.7, 100.95, 0, 0, 100.0)
    # the guider's second call of the step (a lookahead beside its verify): its CPU adds to the first's
    lookahead = Compute("guider", 100.6, 100.62, 5, 1, cpu=0.01)
    calls = {("guider", "verify"): replies(guider), ("guider", "lookahead"): replies(lookahead)}
    clock.phase(100.6, 101.0, calls | {("filter", "accept_probs"): replies(filter_)})
    t = clock.finish(requests=2, end=101.2)
    assert t.round_s == pytest.approx(1.2)
    assert t.orchestrator_s == pytest.approx(0.4)  # before, between and after the two phases
    assert t.queue_s == pytest.approx(0.1)  # the drafter's call waiting for its thread
    assert t.busy_s == pytest.approx(0.15 + 0.35)  # phase 2: the union of the guider's and the filter's
    assert t.hops_s == pytest.approx(0.8 - 0.1 - 0.5)
    assert t.overlap_s == pytest.approx(0.2)  # the guider and the filter at once
    assert t.compute_s == pytest.approx({"drafter": 0.15, "guider": 0.3, "filter": 0.25})
    assert t.idle_s() == pytest.approx({"drafter": 1.05, "guider": 0.9, "filter": 0.95})
    assert t.cpu_s == pytest.approx({"drafter": 0.1, "guider": 0.21, "filter": 0.0})
    assert (t.flops, t.calls) == ({"drafter": 30, "guider": 25, "filter": 0}, {"drafter": 1, "guider": 2, "filter": 1})
    assert t.tokens == {"drafter": 3, "guider": 3, "filter": 0}
    shown = summary([t])  # ms
    assert (shown["compute guider"]["median"], shown["cpu guider"]["median"]) == pytest.approx((300, 210))


def test_in_process_the_parts_add_up_to_the_round_and_the_rounds_to_the_level(engine):
    engine.generate(PROMPTS[0], "pipeline", {"window": 6}, 4)  # warm up outside the level
    row, steps = engine_level(engine, 3, PROMPTS, "pipeline", {"window": 6}, 12)
    unique = list({id(t): t for t in steps}.values())  # a step's record is shared by its rounds
    assert len(steps) == row.tokens / row.tpf  # a timing per request-round
    for t in unique:
        assert t.orchestrator_s > 0 and t.hops_s > 0 and t.overlap_s == 0  # one host at a time in process
        parts = t.orchestrator_s + t.hops_s + t.queue_s + sum(t.compute_s.values())
        assert parts == pytest.approx(t.round_s, abs=1e-9)
        assert t.compute_s["drafter"] > 0 and t.compute_s["guider"] > 0 and t.flops["drafter"] > 0
        assert all(0 < t.cpu_s[h] <= t.compute_s[h] + 1e-3 for h in t.compute_s)  # the worker thread's CPU
    stepped = sum(t.round_s for t in unique)
    assert 0.8 * row.wall_s < stepped < row.wall_s  # the level is its steps, and little between them
    parts = summary(steps)
    assert parts["round"]["mean"] == pytest.approx(
        parts["orchestrator"]["mean"] + parts["hops"]["mean"] + parts["queue"]["mean"] + parts["busy"]["mean"]
    )
    # per request: each request's rounds are the steps that ran them, and its latency their sum and the rest
    per = row.per_request
    assert per["in rounds"]["mean"] * row.requests == pytest.approx(1000 * sum(t.round_s for t in steps))
    assert per["latency"]["mean"] == pytest.approx(per["in rounds"]["mean"] + per["outside rounds"]["mean"])
    assert per["outside rounds"]["mean"] > 0
    outside = ("before first round", "between rounds", "way in and out")
    assert per["outside rounds"]["mean"] == pytest.approx(sum(per[part]["mean"] for part in outside))
    assert all(per[part]["mean"] >= 0 for part in outside)


def test_a_request_that_waits_for_room_spends_it_before_its_first_round(engine):
    """One request runs at a time, so at concurrency 2 each request waits, before its first round, about as long as
    the one before it decoded; every step runs the one that runs, so nothing waits between its rounds."""
    one_at_a_time = replace(engine.config, serving=replace(engine.config.serving, max_concurrency=1))
    eng = Engine(one_at_a_time, executor=engine.executor)
    row, _ = engine_level(eng, 2, PROMPTS, "pipeline", {"window": 6}, 12)
    per = row.per_request
    assert per["before first round"]["median"] > 0.5 * per["in rounds"]["median"]
    assert per["between rounds"]["median"] < 0.1 * per["in rounds"]["median"]
    assert per["way in and out"]["median"] < 0.1 * per["in rounds"]["median"]


def test_bench_breakdown_prints_the_parts_and_mfu(tmp_path, tiny_zoo, capsys):
    config, out = write_config(tmp_path, tiny_zoo), tmp_path / "bench.json"
    args = ["--strategy", "pipeline", "--concurrency", "1,2", "--max-new-tokens", "8", "--breakdown"]
    assert main(["--config", config, "bench", *args, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "MFU" in printed and "c=2 per round, ms" in printed and "compute guider" in printed
    assert "c=2 per request, ms" in printed and "outside rounds" in printed
    rows = json.loads(out.read_text())
    for row in rows:
        assert 0 < row["model_gflops_per_s"] and 0 < row["mfu"] < 1 and row["matmul_shape"].endswith("x [64, 128]")
        assert {"round", "orchestrator", "hops", "compute drafter", "idle guider", "overlap"} <= set(row["breakdown"])


def test_in_process_the_matmul_reference_runs_on_the_forwards_thread(tmp_path, tiny_zoo, monkeypatch):
    """In process MFU's reference matmul runs on the executor's worker, with its torch threads: on a thread of its own
    it led a second OpenMP team beside the forwards' and read low: half at c=1's shape, a fifth at c=16's (mfu.py)."""
    where = []

    def spy(*args):
        where.append((threading.current_thread().name, torch.get_num_threads()))
        return 1e12

    monkeypatch.setattr(mfu, "matmul_flops_per_s", spy)
    config = write_config(tmp_path, tiny_zoo)
    args = ["--strategy", "pipeline", "--concurrency", "1,2", "--max-new-tokens", "4", "--set", "window=4"]
    assert main(["--config", config, "bench", *args]) == 0
    threads = EngineConfig.from_yaml(config).threads or DEFAULT_THREADS
    assert len(where) == 2 and all(name.startswith("dlm-step") and n == threads for name, n in where), where


def test_the_served_matmul_reference_runs_on_a_thread_of_its_own_with_the_configs_threads(tiny_zoo):
    """Served, the client process ran no forward: the reference takes a thread of its own with the config's threads,
    and leaves the caller's as they were (here one, as LocalExecutor leaves its caller)."""
    LocalExecutor(EngineConfig(models=tiny_zoo, threads=2))
    assert torch.get_num_threads() == 1
    assert on_threads(2, torch.get_num_threads) == 2
    assert torch.get_num_threads() == 1
