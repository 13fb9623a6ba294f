"""OpenTelemetry tracing, configured by the standard environment variables:

OTEL_TRACES_EXPORTER   none (also when unset) | console | otlp: spans go nowhere, to stdout, or over OTLP
OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER(_ARG): read by the SDK and the exporter
OTEL_DLM_TRACES_FILE   also write spans as JSON lines to this file (tests read a replica's spans there)

Unset, the tracer is the API's no-op: a span costs one call that returns a shared non-recording span, and no
trace context crosses a hop. The trace context crosses the Ray hops as W3C `traceparent` strings, one per call of
a batch, so that a stage span recorded on a replica is a child of its request's round."""

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

NAME = "dlm"
PROPAGATOR = TraceContextTextMapPropagator()
_tracer: Tracer | None = None


def configure() -> Tracer:
    """The process's tracer, set up from the environment on first use."""
    global _tracer
    if _tracer is None:
        exporters = exporters_from_env()
        if exporters:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

            provider = TracerProvider()  # reads OTEL_SERVICE_NAME and OTEL_TRACES_SAMPLER
            for exporter, batched in exporters:
                provider.add_span_processor(BatchSpanProcessor(exporter) if batched else SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
        _tracer = trace.get_tracer(NAME)  # the global provider: no-op unless set above or by the caller (tests)
    return _tracer


def exporters_from_env() -> list[tuple[object, bool]]:
    """(exporter, batched) per configured destination."""
    out = []
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        out.append((ConsoleSpanExporter(), True))
    elif kind == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        out.append((OTLPSpanExporter(), True))
    elif kind not in ("none", ""):
        raise ValueError(f"OTEL_TRACES_EXPORTER must be otlp, console or none, got {kind!r}")
    path = os.environ.get("OTEL_DLM_TRACES_FILE")
    if path:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # one line per span, written as it ends: a replica may be killed before a batch would flush
        out.append((ConsoleSpanExporter(out=open(path, "a", buffering=1), formatter=json_line), False))
    return out


def json_line(span) -> str:
    return json.dumps(json.loads(span.to_json())) + "\n"


def reset() -> None:
    """Forget the tracer (tests that install their own provider)."""
    global _tracer
    _tracer = None


def traceparent(span: Span) -> str:
    """The W3C traceparent of a recording span; "" for a non-recording one (nothing to link to)."""
    if not span.is_recording():
        return ""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


@contextmanager
def stage_spans(role: str, method: str, parents: list[str] | None, replica: str) -> Iterator[list[Span]]:
    """One span per call of a batched host call, each a child of the round whose traceparent it carries."""
    if not parents or not any(parents):
        yield []
        return
    tracer = configure()
    attributes = {"dlm.role": role, "dlm.method": method, "dlm.replica": replica, "dlm.batch_size": len(parents)}
    spans = [
        tracer.start_span(f"{role}.{method}", PROPAGATOR.extract({"traceparent": p}), attributes=attributes)
        for p in parents
        if p
    ]
    try:
        yield spans
    finally:
        for span in spans:
            span.end()
