"""dlm bench --strategies --repeats: the rows take turns, each timed right after an untimed request of its own, and
each keeps its median run, so that the speedups weigh runs made at the same times."""

from types import SimpleNamespace

import pytest

from services.cli import bench as bench_module
from services.cli.bench import BenchRow, bench
from services.cli.cli import main

ROWS = ["ar", "ar-drafter", "ar-guider", "mdm", "pipeline"]


def test_rows_take_turns_and_each_keeps_its_median_run(monkeypatch):
    ran = []
    speeds = {
        "ar": [10, 30, 20],
        "ar-drafter": [5, 1, 3],
        "ar-guider": [7, 7, 7],
        "mdm": [1, 2, 3],
        "pipeline": [9, 60, 30],
    }

    def run_strategy(engine, name, prompts, max_new_tokens, params, strategy=None):
        ran.append(name)
        return BenchRow(name, 0, 1.0, 1, 0, tokens_per_s=speeds[name][ran.count(name) - 1])

    def generate(prompt, strategy, params, max_new_tokens, sampling):
        ran.append(("warm-up", strategy, params, max_new_tokens))

    monkeypatch.setattr(bench_module, "run_strategy", run_strategy)
    engine = SimpleNamespace(config=SimpleNamespace(models={"drafter": "d", "guider": "g"}), generate=generate)
    rows = bench(engine, ["pipeline"], repeats=3, max_new_tokens=8)
    warm_ups = [
        ("warm-up", "ar", {}, 8),
        ("warm-up", "ar", {"model": "drafter"}, 8),
        ("warm-up", "ar", {"model": "guider"}, 8),
        ("warm-up", "mdm", {}, 8),
        ("warm-up", "pipeline", {}, 8),
    ]
    assert ran == [call for pair in zip(warm_ups, ROWS, strict=True) for call in pair] * 3
    assert [row.tokens_per_s for row in rows] == [20, 3, 7, 2, 30]
    assert rows[-1].speedup_vs_ar_drafter == 10 and rows[-1].speedup_vs_ar == 1.5


def test_repeats_below_one_are_refused():
    with pytest.raises(ValueError, match="--repeats"):
        bench(SimpleNamespace(), ["pipeline"], repeats=0)


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--concurrency", "1", "--repeats", "3"], "--repeats"),
        (["--target", "127.0.0.1:1", "--repeats", "3"], "--repeats"),
        (["--strategies", "pipeline", "--breakdown"], "--breakdown"),
        (["--target", "http://127.0.0.1:1", "--breakdown"], "--breakdown"),
    ],
)
def test_a_flag_the_run_would_ignore_is_an_error_naming_it(flags, named, capsys):
    assert main(["bench", *flags]) == 2  # before any model loads or any server is called
    assert named in capsys.readouterr().err
