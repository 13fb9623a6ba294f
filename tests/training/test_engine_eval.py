import math

from services.training.engine_eval import evaluate


def test_evaluate_reports_accuracy_nll_and_stats(engine):
    report = evaluate(engine, "streaming", {"window": 6}, "tasks", n=1, families=("count", "add"))
    assert set(report["accuracy"]) == {"count", "add"}
    assert all(0 <= v <= 1 for v in report["accuracy"].values())
    assert math.isfinite(report["nll"]) and report["nll"] > 0
    stats = report["stats"]
    assert {"tpf", "tokens_per_forward", "p_cache", "tokens_per_s"} <= set(stats)
    assert stats["model_forwards"] == stats["rounds"]  # streaming: one drafter forward a round
    assert stats["tokens_per_forward"] == stats["tokens"] / stats["model_forwards"]


def test_code_suite_is_open_ended(engine):
    report = evaluate(engine, "ar", {"model": "guider"}, "code", n=1)
    assert report["accuracy"] == {} and math.isfinite(report["nll"])


def test_mask_accuracy_per_ratio(engine):
    from services.training.engine_eval import mask_accuracy

    report = mask_accuracy(engine, ratios=(0.25, 0.75), n=1)
    assert set(report) == {"0.25", "0.75"} and all(0 <= v <= 1 for v in report.values())
