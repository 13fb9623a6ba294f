import json
import math

from services.orchestrator.cli import main
from services.training.engine_eval import evaluate
from tests.orchestrator.test_cli import write_config


def test_evaluate_reports_accuracy_nll_and_stats(engine):
    report = evaluate(engine, "streaming", {"window": 6}, "tasks", n=1, families=("count", "add"))
    assert set(report["accuracy"]) == {"count", "add"}
    assert all(0 <= v <= 1 for v in report["accuracy"].values())
    assert math.isfinite(report["nll"]) and report["nll"] > 0
    assert {"tpf", "p_cache", "tokens_per_s"} <= set(report["stats"])


def test_code_suite_is_open_ended(engine):
    report = evaluate(engine, "ar", {"model": "guider"}, "code", n=1)
    assert report["accuracy"] == {} and math.isfinite(report["nll"])


def test_eval_json_contract(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    args = ["--config", config, "eval", "--strategy", "ar", "--model", "guider", "--n", "1", "--json"]
    assert main([*args, "--families", "sort"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"accuracy", "overall_accuracy", "nll", "stats"} and set(out["accuracy"]) == {"sort"}


def test_mask_accuracy_per_ratio(engine):
    from services.training.engine_eval import mask_accuracy

    report = mask_accuracy(engine, ratios=(0.25, 0.75), n=1)
    assert set(report) == {"0.25", "0.75"} and all(0 <= v <= 1 for v in report.values())
