"""proto/grpc_service.proto is wire-compatible with tritonclient.grpc's copy of the protocol (every
field's number and type, every method's path and streaming), and the committed stubs are what
`make proto` makes of it today."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from anvil_gateway import grpc_stubs
from anvil_gateway.proto_gen import grpc_service_pb2 as ours

ROOT = Path(__file__).resolve().parents[3]
PROTO = ROOT / "proto/grpc_service.proto"
GENERATED = ROOT / "services/gateway/src/anvil_gateway/proto_gen"

triton = pytest.importorskip("tritonclient.grpc.service_pb2")
triton_config = pytest.importorskip("tritonclient.grpc.model_config_pb2")


def _theirs(full_name: str) -> Descriptor:
    return triton.DESCRIPTOR.pool.FindMessageTypeByName(full_name)


def _ours_messages() -> list[Descriptor]:
    out: list[Descriptor] = []

    def walk(d: Descriptor) -> None:
        out.append(d)
        for n in d.nested_types:
            walk(n)

    for d in ours.DESCRIPTOR.message_types_by_name.values():
        walk(d)
    return out


def _kind(f: FieldDescriptor) -> tuple[int, bool, str]:
    """(wire type, repeated, the message or enum it names) of a field."""
    named = f.message_type.full_name if f.message_type else f.enum_type.full_name if f.enum_type else ""
    return f.type, f.is_repeated, named


@pytest.mark.parametrize("message", _ours_messages(), ids=lambda d: d.full_name)
def test_every_field_matches_tritonclient(message: Descriptor) -> None:
    theirs = _theirs(message.full_name)
    for f in message.fields:
        match = theirs.fields_by_number.get(f.number)
        where = f"{message.full_name}.{f.name} = {f.number}"
        assert match is not None, f"{where}: no such field in tritonclient's"
        assert match.name == f.name, (message.full_name, f.number, f.name, match.name)
        assert _kind(f) == _kind(match), (message.full_name, f.name, _kind(f), _kind(match))


def _enums() -> list[EnumDescriptor]:
    found = list(ours.DESCRIPTOR.enum_types_by_name.values())
    for d in _ours_messages():
        found.extend(d.enum_types)
    return found


@pytest.mark.parametrize("enum", _enums(), ids=lambda e: e.full_name)
def test_every_enum_value_matches(enum: EnumDescriptor) -> None:
    theirs = triton.DESCRIPTOR.pool.FindEnumTypeByName(enum.full_name)
    values = {v.name: v.number for v in theirs.values}
    assert {v.name: v.number for v in enum.values}.items() <= values.items()


def test_every_method_has_tritonclients_path_and_types() -> None:
    service = ours.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == theirs.full_name == "inference.GRPCInferenceService"
    missing = {m.name for m in theirs.methods} - {m.name for m in service.methods}
    assert missing == {"TraceSetting", "LogSettings"}  # not offered: UNIMPLEMENTED (docs/protocol.md)
    for m in service.methods:
        t = theirs.methods_by_name[m.name]
        assert m.input_type.full_name == t.input_type.full_name
        assert m.output_type.full_name == t.output_type.full_name
        assert (m.client_streaming, m.server_streaming) == (t.client_streaming, t.server_streaming)


def test_a_request_round_trips_through_tritonclients_messages() -> None:
    req = ours.ModelInferRequest(model_name="mlp", id="7", raw_input_contents=[b"\x00" * 8])
    req.parameters["priority"].int64_param = 1
    t = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    t.parameters["shared_memory_region"].string_param = "r"
    back = triton.ModelInferRequest.FromString(req.SerializeToString())
    assert back.parameters["priority"].int64_param == 1
    assert back.inputs[0].parameters["shared_memory_region"].string_param == "r"
    assert list(back.inputs[0].shape) == [1, 2] and back.raw_input_contents == [b"\x00" * 8]
    cfg = ours.ModelConfig(name="m", max_batch_size=8, backend="anvil")
    cfg.input.add(name="x", data_type=ours.TYPE_FP32, dims=[16])
    cfg.dynamic_batching.priority_queue_policy[2].default_timeout_microseconds = 200_000
    theirs = triton_config.ModelConfig.FromString(cfg.SerializeToString())
    assert theirs.input[0].data_type == triton_config.TYPE_FP32 and list(theirs.input[0].dims) == [16]
    assert theirs.dynamic_batching.priority_queue_policy[2].default_timeout_microseconds == 200_000


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the dev group: uv sync")
    for made in grpc_stubs.generate(PROTO, tmp_path):
        assert made.read_text() == (GENERATED / made.name).read_text(), (
            f"stale {made.name}: run `make proto` and commit the result"
        )
