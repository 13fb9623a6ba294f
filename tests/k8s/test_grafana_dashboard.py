"""k8s/grafana-dashboard.json graphs every dlm_* metric under the name Ray exports it with (prefix `ray_`)."""

import json
import re

import pytest

from tests.k8s.manifests import K8S_DIR

HISTOGRAMS = {
    "dlm_time_to_first_token_seconds": (),
    "dlm_e2e_request_latency_seconds": (),
    "dlm_time_per_output_token_seconds": (),
    "dlm_tokens_per_round": ("strategy",),
    "dlm_draft_acceptance_ratio": ("strategy",),
}
GAUGES = ["dlm_num_requests_running", "dlm_num_requests_waiting", "dlm_kv_cache_usage_perc"]  # per replica
COUNTERS = {
    "dlm_prompt_tokens_total": (),
    "dlm_generation_tokens_total": (),
    "dlm_request_success_total": ("finish_reason",),
}


def exprs() -> list[str]:
    dashboard = json.loads((K8S_DIR / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


@pytest.mark.parametrize("metric", HISTOGRAMS)
def test_histograms_are_graphed_as_p50_p90_p99_over_one_minute_rates(metric):
    by = ", ".join(("le",) + HISTOGRAMS[metric])
    rate = rf"rate\(ray_{metric}_bucket\{{.*\}}\[1m\]\)"
    pattern = rf"histogram_quantile\(([\d.]+), sum by \({by}\) \({rate}\)\)"
    quantiles = {float(m.group(1)) for e in exprs() if (m := re.fullmatch(pattern, e))}
    assert quantiles == {0.5, 0.9, 0.99}


@pytest.mark.parametrize("metric", GAUGES)
def test_gauges_are_graphed_per_replica(metric):
    assert any(re.search(rf"by \(replica\) \(ray_{metric}\{{", e) for e in exprs())


@pytest.mark.parametrize("metric", COUNTERS)
def test_counters_are_graphed_as_rates(metric):
    by = f"by \\({', '.join(COUNTERS[metric])}\\) " if COUNTERS[metric] else ""
    assert any(re.fullmatch(rf"sum {by}?\(rate\(ray_{metric}\{{.*\}}\[1m\]\)\)", e) for e in exprs())
