"""Fuzz the live gRPC server (in process, over loopback) with GenerateRequest messages: any field, any value.
Every call ends OK or with a documented status naming what is wrong, never INTERNAL or UNKNOWN; afterwards the
server is SERVING and holds no request state."""

from dataclasses import replace

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.orchestrator.api.frontend import Frontend
from services.orchestrator.api.grpc_server import Limits
from services.orchestrator.decode.strategies import STRATEGIES
from services.orchestrator.engine.engine import Engine
from services.serving.wire import pb
from tests.orchestrator.api.test_server import PROMPT, Harness

# what bad input may get (README, "gRPC API"); DEADLINE_EXCEEDED is left out on purpose: every call fits its deadline
DOCUMENTED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
DEADLINE_S = 30

INTS = {
    F.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    F.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    F.TYPE_UINT32: st.integers(0, 2**32 - 1),
    F.TYPE_UINT64: st.integers(0, 2**64 - 1),
}
# small values beside the extremes, so that some requests are valid enough to decode
SMALL_INT = st.integers(-2, 40)


def scalar(field) -> st.SearchStrategy:
    if field.type in INTS:
        small = SMALL_INT.filter(lambda v: v >= 0) if field.type in (F.TYPE_UINT32, F.TYPE_UINT64) else SMALL_INT
        return st.one_of(small, INTS[field.type])
    if field.type == F.TYPE_FLOAT:
        return st.floats(width=32)
    if field.type == F.TYPE_DOUBLE:
        return st.floats()
    if field.type == F.TYPE_BOOL:
        return st.booleans()
    if field.type == F.TYPE_STRING:
        return st.one_of(st.sampled_from(sorted(STRATEGIES) + ["causal", "prefix", "dual", "ar"]), st.text(max_size=40))
    if field.type == F.TYPE_BYTES:
        return st.binary(max_size=40)
    if field.type == F.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-5, 50))
    raise AssertionError(f"no strategy for {field.full_name}")


@st.composite
def message(draw, descriptor, odds: int = 2, depth: int = 0) -> dict:
    """Field values of a message of descriptor: each field set at 1 in `odds`, to any value."""
    values = {}
    for field in descriptor.fields:
        if draw(st.integers(1, odds)) != 1:
            continue
        if field.type == F.TYPE_MESSAGE:
            if depth < 3:
                values[field.name] = draw(message(field.message_type, odds, depth + 1))
            continue
        if field.is_repeated:
            values[field.name] = draw(st.lists(scalar(field), max_size=10))
        else:
            values[field.name] = draw(scalar(field))
    return values


def requests() -> st.SearchStrategy:
    """GenerateRequests: fully random ones, and (twice as often) a few random fields under a short text or token-id
    prompt and a small max_new_tokens, where the random fields decide whether it decodes."""
    fields, few = message(pb.GenerateRequest.DESCRIPTOR), message(pb.GenerateRequest.DESCRIPTOR, odds=4)
    ids = st.lists(st.one_of(st.integers(0, 400), INTS[F.TYPE_UINT32]), min_size=1, max_size=12)
    prompt = st.one_of(st.just({"text": PROMPT}), ids.map(lambda ids: {"token_ids": {"ids": ids}}))
    sane = st.tuples(prompt, st.integers(1, 4)).map(lambda pair: {**pair[0], "max_new_tokens": pair[1]})
    over_sane = st.tuples(few, sane).map(list)  # the prompt set last wins its oneof
    return st.one_of(fields.map(lambda f: [f]), over_sane, over_sane).map(build)


def build(layers: list[dict]):
    out = pb.GenerateRequest()
    for values in layers:
        assign(out, values)
    return out


def assign(out, values: dict) -> None:
    """Set fields one by one: a later oneof member replaces an earlier one, as on the wire."""
    for name, value in values.items():
        if isinstance(value, dict):
            assign(getattr(out, name), value)
            getattr(out, name).SetInParent()
        elif isinstance(value, list):
            getattr(out, name).extend(value)
        else:
            setattr(out, name, value)


@pytest.fixture(scope="module")
def fuzzed(engine):
    serving = replace(engine.config.serving, limits=Limits(max_new_tokens=8))
    harness = Harness(Frontend(Engine(replace(engine.config, serving=serving), executor=engine.executor)))
    harness.client.wait_ready()
    yield harness
    harness.close()


def test_any_generate_request_ends_ok_or_with_a_documented_status(fuzzed):
    stub = fuzzed.client.stub

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(requests(), st.booleans())
    def call(request, stream):
        try:
            if stream:
                list(stub.GenerateStream(request, timeout=DEADLINE_S))
            else:
                stub.Generate(request, timeout=DEADLINE_S)
        except grpc.RpcError as e:
            assert e.code() in DOCUMENTED, f"{e.code().name}: {e.details()} for {request}"
            assert e.details(), f"{e.code().name} without a message for {request}"

    call()
    assert fuzzed.client.health() == "SERVING"
    assert fuzzed.backend.live() == []
    hosts = fuzzed.backend.engine.executor.hosts.values()
    assert not [rid for host in hosts if hasattr(host, "kv") for rid in host.kv.caches]
