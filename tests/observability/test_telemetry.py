"""In process: the span tree request -> round -> stage with its attributes, and the finished-request log line."""

import json
import logging

import pytest

from services.common.config import EngineConfig
from services.orchestrator.engine.engine import Engine
from tests.observability.spans import memory_exporter

PROMPT = "count from 1 to 9:"


def test_request_round_and_stage_spans_carry_their_attributes(tiny_zoo):
    exporter = memory_exporter()
    engine = Engine(EngineConfig(models=tiny_zoo, max_new_tokens=16))
    result = engine.generate(PROMPT, "pipeline", {"window": 6}, 12)
    spans = exporter.get_finished_spans()
    [request] = [s for s in spans if s.name == "dlm.request"]
    rounds = [s for s in spans if s.name == "dlm.round"]
    stages = [s for s in spans if s.name not in ("dlm.request", "dlm.round")]
    a = request.attributes
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.request.model"] == "drafter"
    assert a["gen_ai.request.max_tokens"] == 12 and a["gen_ai.usage.input_tokens"] > 0
    assert a["gen_ai.usage.output_tokens"] == len(result.token_ids) > 0
    assert tuple(a["gen_ai.response.finish_reasons"]) == (result.finish_reason,)
    assert a["dlm.strategy"] == "pipeline" and a["dlm.tpf"] == result.stats["tpf"] and "dlm.p_cache" in a
    assert len(rounds) == result.stats["rounds"]
    assert all(r.parent.span_id == request.context.span_id for r in rounds)
    assert sum(r.attributes["dlm.tokens_accepted"] for r in rounds) >= len(result.token_ids)
    for r in (r.attributes for r in rounds):  # where the round went, as `dlm bench --breakdown` prints it
        parts = r["dlm.orchestrator_s"] + r["dlm.hops_s"] + r["dlm.queue_s"] + r["dlm.compute_s.drafter"]
        parts += r["dlm.compute_s.guider"]
        assert parts + r["dlm.compute_s.filter"] == pytest.approx(r["dlm.round_s"]) and r["dlm.overlap_s"] == 0
        assert r["dlm.idle_s.guider"] == pytest.approx(r["dlm.round_s"] - r["dlm.compute_s.guider"])
        assert 0 < r["dlm.cpu_s.drafter"] <= r["dlm.compute_s.drafter"] + 1e-3
        assert r["dlm.flops.drafter"] > 0
    round_ids = {r.context.span_id for r in rounds}
    assert {s.name for s in stages} >= {"drafter.propose", "guider.verify", "filter.accept_probs"}
    assert all(s.parent.span_id in round_ids and s.attributes["dlm.replica"] == "local" for s in stages)
    assert all(s.context.trace_id == request.context.trace_id for s in spans)


def test_a_finished_request_logs_one_json_line(engine, caplog):
    with caplog.at_level(logging.INFO, logger="dlm.requests"):
        result = engine.generate(PROMPT, "streaming", {"window": 6}, 10)
    [line] = [r.getMessage() for r in caplog.records if r.name == "dlm.requests"]
    record = json.loads(line)
    assert record["event"] == "request_finished" and record["strategy"] == "streaming"
    assert record["output_tokens"] == len(result.token_ids) and record["rounds"] == result.stats["rounds"]
    assert record["prompt_tokens"] > 0 and record["finish_reason"] == result.finish_reason
    assert record["tpf"] == round(result.stats["tpf"], 4)
    assert 0 < record["ttft_s"] <= record["latency_s"]
    assert record["replicas"] == {"drafter": "local"} and record["request_id"].startswith("req-")
