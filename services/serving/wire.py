"""Conversions between the dlm.v1 messages and Python values, shared by the server and the client."""

from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from services.common.params import parse_value
from services.serving.protogen import load

pb, rpc = load()
SERVICE = "dlm.v1.DlmService"
# the header a Generate / GenerateStream call gets once the server holds its request: after it, a broken call resumes
REQUEST_ID_HEADER = "dlm-request-id"

FINISH = {
    "eos": pb.FINISH_REASON_EOS,
    "length": pb.FINISH_REASON_LENGTH,
    "stop": pb.FINISH_REASON_STOP_SEQUENCE,
    "cancelled": pb.FINISH_REASON_CANCELLED,
}
FINISH_NAMES = {
    pb.FINISH_REASON_UNSPECIFIED: None,
    pb.FINISH_REASON_EOS: "eos",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_STOP_SEQUENCE: "stop_sequence",
    pb.FINISH_REASON_CANCELLED: "cancelled",
}
KINDS = {
    FieldDescriptor.CPPTYPE_INT32: int,
    FieldDescriptor.CPPTYPE_DOUBLE: float,
    FieldDescriptor.CPPTYPE_BOOL: bool,
    FieldDescriptor.CPPTYPE_STRING: str,
}
STATS = [f.name for f in pb.Stats.DESCRIPTOR.fields]


def strategy_names() -> list[str]:
    return [f.name for f in pb.StrategyParams.DESCRIPTOR.oneofs_by_name["kind"].fields]


def params_dict(msg) -> tuple[str | None, dict[str, Any]]:
    """StrategyParams -> (strategy it is for, the fields that are set)."""
    kind = msg.WhichOneof("kind")
    if kind is None:
        return None, {}
    return kind, {f.name: value for f, value in getattr(msg, kind).ListFields()}


def params_message(strategy: str, values: dict[str, Any]):
    """(strategy, {name: value}) -> StrategyParams; string values (from --set) are parsed by the field's type."""
    if strategy not in strategy_names():
        raise ValueError(f"unknown strategy {strategy!r}; choose from {sorted(strategy_names())}")
    msg = pb.StrategyParams()
    sub = getattr(msg, strategy)
    sub.SetInParent()
    for key, raw in values.items():
        field = sub.DESCRIPTOR.fields_by_name.get(key)
        if field is None:
            known = sorted(sub.DESCRIPTOR.fields_by_name)
            raise ValueError(f"unknown parameter {key!r} for strategy {strategy!r}; known: {known}")
        try:
            setattr(sub, key, parse_value(KINDS[field.cpp_type], raw))
        except (TypeError, ValueError) as e:
            raise ValueError(f"parameter {key!r}: {e}") from None
    return msg


def stats_message(stats: dict):
    return pb.Stats(**{k: stats[k] for k in STATS})


def stats_dict(msg) -> dict[str, Any]:
    return {k: getattr(msg, k) for k in STATS}


def add_event(out, event) -> None:
    """Collect a stream's event (Chunk, Spans, Complete) into a GenerateResponse, as the unary Generate answers."""
    if isinstance(event, pb.Chunk):
        out.text += event.text
        out.token_ids.extend(event.token_ids)
        out.logprobs.extend(event.logprobs)
    elif isinstance(event, pb.Complete):
        if event.HasField("last_chunk"):
            add_event(out, event.last_chunk)
        out.finish_reason = event.finish_reason
        out.trace.extend(event.trace)
        out.usage.CopyFrom(event.usage)
        out.stats.CopyFrom(event.stats)
        out.seed = event.seed
