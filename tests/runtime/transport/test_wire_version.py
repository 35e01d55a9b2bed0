"""The wire version moves with the schema, and its refusal names both versions and the fix."""

from __future__ import annotations

import hashlib

import pytest

from fedfair.runtime.transport import JOIN, WireStage

from fedfair.runtime.transport import (
    WIRE_VERSION,
    describe_version,
    pb,
    plan_request,
    refusal_details,
    refusing_version,
)

PINNED = (5, "4ee531dcb2998ccc3059c29bdc545000bd814c12f1b85980d04dd8be3fc9bce9")
"""WIRE_VERSION and the digest of the stage binding it was raised for (version 3: (aggregation, step);
versions 4 and 5 changed payloads, not the binding)."""


def stage_digest() -> str:
    """sha256 of the Stage enum's (number, name) pairs and the Binding's fields: how a message names its stage, which
    a peer of another release would read differently."""
    stages = sorted((value.number, value.name) for value in pb.DESCRIPTOR.enum_types_by_name["Stage"].values)
    binding = sorted((field.number, field.name, field.type) for field in pb.Binding.DESCRIPTOR.fields)
    return hashlib.sha256(repr((stages, binding)).encode()).hexdigest()


def test_the_wire_version_changes_with_the_stages_and_only_with_them() -> None:
    version, digest = PINNED
    if stage_digest() != digest:
        assert WIRE_VERSION != version, (
            "proto/fedfair.proto's Stage enum or Binding changed but WIRE_VERSION did not: a peer of the previous release "
            "would read these stages differently; raise WIRE_VERSION in fedfair/runtime/transport/wire_version.py, "
            f"add a CHANGELOG line, and pin PINNED = ({version + 1}, {stage_digest()!r}) here"
        )
        pytest.fail(f"WIRE_VERSION was raised to {WIRE_VERSION}: pin PINNED = ({WIRE_VERSION}, {stage_digest()!r})")
    assert WIRE_VERSION == version, (
        f"WIRE_VERSION changed to {WIRE_VERSION} but the Stage enum and the Binding did not: if another incompatible change of "
        f"proto/fedfair.proto called for it, pin PINNED = ({WIRE_VERSION}, {digest!r}) here"
    )


def test_an_old_peer_reads_as_version_0_and_is_named_as_such() -> None:
    # A message of a release before the field existed: the same bytes as one that never sets it.
    unversioned = pb.PlanRequest.FromString(pb.PlanRequest(binding=plan_request().binding).SerializeToString())
    assert unversioned.wire_version == 0
    assert describe_version(0) == "version 0 (a fedfair release before the wire was versioned)"
    assert describe_version(3) == "version 3"


def test_this_releases_request_carries_its_version_and_joins_as_asked() -> None:
    request = plan_request("fed")
    assert request.wire_version == WIRE_VERSION
    assert (request.binding.federation_id, request.binding.round, WireStage.of(request.binding)) == ("fed", 0, JOIN)


@pytest.mark.parametrize("theirs", [0, 1, WIRE_VERSION + 1])
def test_the_refusal_names_both_versions_and_the_fix_and_reads_back(theirs: int) -> None:
    details = refusal_details(WIRE_VERSION, theirs)
    assert (
        f"this aggregator speaks fedfair wire version {WIRE_VERSION}, the caller {describe_version(theirs)}" in details
    )
    assert "run the same fedfair version at every party" in details
    assert refusing_version(details) == WIRE_VERSION


@pytest.mark.parametrize("details", [None, "", "not expected for this federation", "wire version mismatch: ?"])
def test_other_refusals_are_not_read_as_a_version(details: str | None) -> None:
    assert refusing_version(details) is None
