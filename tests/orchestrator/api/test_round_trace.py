"""A round's timing crosses gRPC whole: what the server puts in a RoundTrace, the client's breakdown reads back."""

from services.cli.breakdown import from_trace
from services.orchestrator.api.deltas import RoundRow
from services.orchestrator.api.grpc_server import round_trace
from services.orchestrator.engine.round_timing import RoundTiming


def test_a_round_trace_carries_every_field_of_its_steps_timing():
    hosts = ("drafter", "guider", "filter")
    timing = RoundTiming(
        0.015, 0.001, 0.002, 0.0005, 0.0001,
        compute_s=dict(zip(hosts, (0.008, 0.003, 0.0003), strict=True)),
        flops=dict(zip(hosts, (123_456_789, 23_456_789, 0), strict=True)),
        tokens=dict(zip(hosts, (26, 17, 0), strict=True)),
        calls=dict.fromkeys(hosts, 1),
        requests=3,
        cpu_s=dict(zip(hosts, (0.007, 0.0025, 0.0002), strict=True)),
    )  # fmt: skip
    message = round_trace(RoundRow(2, 5, 1, 0.04, timing))
    assert (message.round, message.prefix_tokens, message.span_tokens, message.elapsed_s) == (2, 5, 1, 0.04)
    assert from_trace(message) == timing
    assert from_trace(round_trace(RoundRow(1, 3, 0, 0.01))) is None  # a request that ended without a step's round
