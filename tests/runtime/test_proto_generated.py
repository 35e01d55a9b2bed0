"""The committed gRPC modules are exactly what the pinned grpcio-tools makes of proto/fedfair.proto,
and the schema keeps its promises: every RPC message bound, no names, no per-sample values."""

from __future__ import annotations

from pathlib import Path

from fedfair.runtime.transport import codegen, fedfair_pb2


def test_committed_modules_match_a_fresh_generation(tmp_path: Path) -> None:
    fresh = codegen.generate(tmp_path)
    for path in fresh:
        committed = codegen.PACKAGE_DIR / path.name
        assert committed.exists(), f"{committed} is missing; run `python -m fedfair.runtime.transport.codegen`"
        assert committed.read_text() == path.read_text(), (
            f"{committed} differs from proto/fedfair.proto; run `python -m fedfair.runtime.transport.codegen` and commit"
        )


def test_the_grpc_module_imports_the_package_module() -> None:
    from fedfair.runtime.transport import fedfair_pb2_grpc

    assert fedfair_pb2_grpc.fedfair__pb2 is fedfair_pb2


SERVICE = fedfair_pb2.DESCRIPTOR.services_by_name["Federation"]
FORBIDDEN = (
    "name",
    "collaborator",
    "sender",
    "peer",
    "identity",
    "institution",
    "loss",
    "label",
    "prediction",
    "sample",
    "feature",
)


def all_messages() -> list:  # type: ignore[type-arg]
    return list(fedfair_pb2.DESCRIPTOR.message_types_by_name.values())


def test_every_rpc_message_is_bound_to_federation_round_stage_and_step() -> None:
    binding = fedfair_pb2.DESCRIPTOR.message_types_by_name["Binding"]
    assert [field.name for field in binding.fields] == ["federation_id", "round", "stage", "step"]
    for method in SERVICE.methods:
        for message in (method.input_type, method.output_type):
            bound = [field for field in message.fields if field.message_type is binding]
            assert len(bound) == 1, f"{method.name}: {message.name} carries no Binding"


def test_no_message_carries_a_name_or_a_per_sample_value() -> None:
    for message in all_messages():
        for field in message.fields:
            assert not any(word in field.name for word in FORBIDDEN), f"{message.name}.{field.name}"
            # Only scalars and opaque, size-bounded chunks: no repeated fields at all.
            assert not field.is_repeated, f"{message.name}.{field.name} is repeated"


def test_the_service_comment_states_the_guarantees() -> None:
    text = (codegen.PROTO_DIR / codegen.PROTO_FILE).read_text()
    comment = text[: text.index("service Federation")]
    assert "no message type can carry a per-sample value" in comment.lower().replace("\n//", "")
    assert "identity from its tls client certificate alone" in " ".join(comment.lower().replace("//", " ").split())
