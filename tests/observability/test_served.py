"""On a real Serve app: spans cross the Ray hops (a replica's stage span is a child of its round), and Ray's
Prometheus endpoint counts exactly the requests sent."""

import asyncio
import json
import os
import re
import signal
import time
import urllib.request

import pytest
import yaml

from services.cli.client import DlmClient
from services.common.config import EngineConfig
from services.serving.ray_env import set_ray_env
from tests.observability.spans import hex_id, memory_exporter
from tests.orchestrator.cluster.test_services import free_port
from tests.replica_processes import replica_pids
from tests.written import whole_lines

pytestmark = pytest.mark.e2e
PROMPT = "count from 1 to 9:"
HISTOGRAMS = ("dlm_time_to_first_token_seconds", "dlm_e2e_request_latency_seconds", "dlm_time_per_output_token_seconds")
GAUGES = ("dlm_num_requests_running", "dlm_num_requests_waiting", "dlm_kv_cache_usage_perc")


@pytest.fixture(scope="module")
def served(tiny_zoo, tmp_path_factory, redis_url):
    """The app with every Ray worker writing its spans to one file, and Ray's metrics on a loopback port."""
    ray = pytest.importorskip("ray")
    from ray import serve

    from services.orchestrator.cluster.app import build_app

    root = tmp_path_factory.mktemp("obs")
    port, metrics_port, spans = free_port(), free_port(), root / "spans.jsonl"
    config = root / "dlm.yaml"
    serving = {"port": port, "resume_timeout_s": 1.0, "redis_url": redis_url}
    config.write_text(yaml.safe_dump({"engine": {"models": tiny_zoo, "max_new_tokens": 16, "serving": serving}}))
    set_ray_env()
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        logging_level="ERROR",
        _node_ip_address="127.0.0.1",
        _metrics_export_port=metrics_port,
        _system_config={"metrics_report_interval_ms": 500},
        runtime_env={"env_vars": {"OTEL_DLM_TRACES_FILE": str(spans)}},
    )
    serve.run(build_app({"config": str(config)}), name="dlm", route_prefix=None)
    client = DlmClient(f"127.0.0.1:{port}", timeout=120)
    deadline = time.monotonic() + 180
    while client.health() != "SERVING":
        assert time.monotonic() < deadline, "the service never became SERVING"
        time.sleep(0.5)
    yield client, spans, metrics_port, str(config)
    client.close()
    serve.shutdown()
    ray.shutdown()


def file_spans(path, trace_id: str | None = None) -> list[dict]:
    spans = [json.loads(line) for line in whole_lines(path) if line.strip()]
    return [s for s in spans if trace_id is None or s["context"]["trace_id"] == trace_id]


def test_a_replica_stage_span_is_a_child_of_its_round_in_memory(served):
    """The orchestrator's side in this process, on the SDK's in-memory exporter; the replicas' side in their file."""
    from ray import serve

    from services.orchestrator.cluster.remote_executor import RemoteExecutor
    from services.orchestrator.engine.engine import Engine
    from services.serving.direct import DirectHandle

    _, spans_file, _, config = served
    exporter = memory_exporter()
    cfg = EngineConfig.from_yaml(config)
    handles = {role: serve.get_deployment_handle(role, "dlm") for role in ("drafter", "guider", "ar", "filter")}
    hosts = RemoteExecutor(cfg, {role: DirectHandle(handle, role) for role, handle in handles.items()})
    engine = Engine(cfg, hosts)
    req = engine.request(PROMPT, 8)

    async def drive():
        await hosts.start()
        engine.add(req, "pipeline", {"window": 6})
        while engine.has_unfinished():
            await engine.step_async(lambda out: None)

    asyncio.run(drive())
    local = exporter.get_finished_spans()
    [request] = [s for s in local if s.name == "dlm.request"]
    rounds = {hex_id(s.context.span_id): s for s in local if s.name == "dlm.round"}
    assert request.attributes["gen_ai.usage.output_tokens"] == req.stats.tokens > 0
    assert len(rounds) == req.stats.rounds and all(r.parent.span_id == request.context.span_id for r in rounds.values())
    trace_id = f"0x{request.context.trace_id:032x}"
    deadline = time.monotonic() + 10
    while not (remote := file_spans(spans_file, trace_id)):
        assert time.monotonic() < deadline, "no replica recorded a span of the trace"
        time.sleep(0.2)
    assert {s["name"] for s in remote} >= {"drafter.propose", "guider.verify", "filter.accept_probs"}
    assert all(s["parent_id"] in rounds for s in remote)
    replicas = {s["attributes"]["dlm.replica"] for s in remote}
    assert len(replicas) == 3 and all(replicas)


def test_a_served_request_has_the_span_tree_in_its_workers(served):
    client, spans_file, _, _ = served
    reply = client.generate(PROMPT, strategy="pipeline", params={"window": 6}, max_new_tokens=8, request_id="traced")
    deadline = time.monotonic() + 10
    while True:
        requests = [s for s in file_spans(spans_file) if s["attributes"].get("dlm.request_id") == "traced"]
        if requests:
            break
        assert time.monotonic() < deadline, "the orchestrator recorded no request span"
        time.sleep(0.2)
    [request] = requests
    trace = file_spans(spans_file, request["context"]["trace_id"])
    rounds = {s["context"]["span_id"] for s in trace if s["name"] == "dlm.round"}
    stages = [s for s in trace if s["name"] not in ("dlm.request", "dlm.round")]
    assert len(rounds) == reply.stats.rounds
    assert request["attributes"]["gen_ai.usage.output_tokens"] == len(reply.token_ids)
    assert stages and all(s["parent_id"] in rounds for s in stages)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def total(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include these."""
    out = 0.0
    for m in re.finditer(rf"^ray_{name}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            out += float(m.group(2))
    return out


def settled(port: int) -> str:
    """A scrape after earlier requests' metrics have reached the endpoint (Ray reports every 0.5 s here)."""
    last = None
    while True:
        text = scrape(port)
        if last is not None and total(text, "dlm_request_success_total") == total(last, "dlm_request_success_total"):
            return text
        last = text
        time.sleep(1.5)


def test_ray_metrics_endpoint_counts_the_requests_sent(served):
    client, _, metrics_port, _ = served
    before = settled(metrics_port)
    replies = [
        client.generate(PROMPT, strategy="streaming", params={"window": 6}, max_new_tokens=8 + i) for i in range(3)
    ]
    prompt_tokens = sum(r.usage.prompt_tokens for r in replies)
    expected = {
        "dlm_request_success_total": 3,
        "dlm_generation_tokens_total": sum(len(r.token_ids) for r in replies),
        "dlm_prompt_tokens_total": prompt_tokens,
        **{f"{h}_count": 3 for h in HISTOGRAMS},
    }
    deadline = time.monotonic() + 30
    while True:
        text = scrape(metrics_port)
        got = {name: total(text, name) - total(before, name) for name in expected}
        rounds = total(text, "dlm_tokens_per_round_count", strategy="streaming") - total(
            before, "dlm_tokens_per_round_count", strategy="streaming"
        )
        if got == expected and rounds == sum(r.stats.rounds for r in replies):
            break
        assert time.monotonic() < deadline, f"metrics never matched: {got} vs {expected}, rounds {rounds}"
        time.sleep(0.5)
    assert total(text, "dlm_draft_acceptance_ratio_count", strategy="streaming") > 0
    for gauge in GAUGES:
        assert re.search(rf'^ray_{gauge}\{{[^}}]*replica="[^"]+"', text, re.M), gauge
    assert re.search(r'^ray_dlm_kv_cache_usage_perc\{[^}]*deployment="drafter"', text, re.M)


def own_replica_pid(deployment: str, marker: str) -> int:
    """This cluster's replica of `deployment`: its environment holds marker."""
    [pid] = replica_pids(deployment, marker)
    return pid


def test_check_health_fails_while_a_model_replica_does_not_answer(served):
    from ray import serve

    _, spans_file, _, _ = served
    app = serve.get_app_handle("dlm")
    app.check_health.remote().result(timeout_s=30)
    filter_replica = own_replica_pid("filter", str(spans_file))
    os.kill(filter_replica, signal.SIGSTOP)
    try:
        app.check_health.remote().result(timeout_s=30)  # down, but not yet for serving.resume_timeout_s
        with pytest.raises(Exception, match="model deployments down.*filter"):
            app.check_health.remote().result(timeout_s=30)
    finally:
        os.kill(filter_replica, signal.SIGCONT)
    app.check_health.remote().result(timeout_s=30)
