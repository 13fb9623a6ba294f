"""dlm.v1 stays wire compatible with the previous release (tests/serving/baseline/dlm_v1.proto): `buf breaking`-style
rules on the descriptors: nothing removed or renumbered, no field changes its name, type or cardinality, no method
its types. Fields may be added; an existing scalar may gain explicit presence (`optional`: the same bytes on the
wire)."""

import os

from google.protobuf import descriptor_pb2

from services.serving.wire import pb

BASELINE = os.path.join(os.path.dirname(__file__), "baseline")


def descriptor_set(proto_dir: str, proto: str, tmp_path) -> descriptor_pb2.FileDescriptorProto:
    from grpc_tools import protoc

    out = str(tmp_path / "set.pb")
    assert protoc.main(["protoc", f"-I{proto_dir}", f"--descriptor_set_out={out}", proto]) == 0
    files = descriptor_pb2.FileDescriptorSet.FromString(open(out, "rb").read())
    return files.file[0]


def current() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(proto)
    return proto


def breaking(old: descriptor_pb2.FileDescriptorProto, new: descriptor_pb2.FileDescriptorProto) -> list[str]:
    problems = []
    if old.package != new.package:
        problems.append(f"package {old.package} became {new.package}")
    messages = {m.name: m for m in new.message_type}
    for message in old.message_type:
        if message.name not in messages:
            problems.append(f"message {message.name} removed")
            continue
        fields = {f.number: f for f in messages[message.name].field}
        for field in message.field:
            now = fields.get(field.number)
            if now is None:
                problems.append(f"{message.name}.{field.name} (#{field.number}) removed")
                continue
            for attr in ("name", "type", "type_name", "label"):
                if getattr(field, attr) != getattr(now, attr):
                    problems.append(f"{message.name}.{field.name} (#{field.number}) changed its {attr}")
            in_oneof = field.HasField("oneof_index") and not field.proto3_optional
            if in_oneof != (now.HasField("oneof_index") and not now.proto3_optional):
                problems.append(f"{message.name}.{field.name} moved into or out of a oneof")
    enums = {e.name: {v.number: v.name for v in e.value} for e in new.enum_type}
    for enum in old.enum_type:
        for value in enum.value:
            if enums.get(enum.name, {}).get(value.number) != value.name:
                problems.append(f"enum {enum.name}.{value.name} (= {value.number}) removed or renamed")
    services = {s.name: {m.name: m for m in s.method} for s in new.service}
    for service in old.service:
        for method in service.method:
            now = services.get(service.name, {}).get(method.name)
            if now is None:
                problems.append(f"rpc {service.name}.{method.name} removed")
            elif (now.input_type, now.output_type, now.server_streaming, now.client_streaming) != (
                method.input_type,
                method.output_type,
                method.server_streaming,
                method.client_streaming,
            ):
                problems.append(f"rpc {service.name}.{method.name} changed its signature")
    return problems


def test_dlm_v1_is_backward_compatible_with_the_previous_release(tmp_path):
    old = descriptor_set(BASELINE, "dlm_v1.proto", tmp_path)
    assert breaking(old, current()) == []


def test_the_check_catches_a_renumbered_field(tmp_path):
    old = descriptor_set(BASELINE, "dlm_v1.proto", tmp_path)
    new = current()
    chunk = next(m for m in new.message_type if m.name == "Chunk")
    next(f for f in chunk.field if f.name == "rounds").number = 99
    assert any("Chunk.rounds" in p for p in breaking(old, new))
    sampling = next(m for m in new.message_type if m.name == "SamplingParams")
    next(f for f in sampling.field if f.name == "seed").type = descriptor_pb2.FieldDescriptorProto.TYPE_INT32
    assert any("SamplingParams.seed" in p and "type" in p for p in breaking(old, new))
