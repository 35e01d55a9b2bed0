"""Which version of the wire schema a peer speaks, so that a peer of another fedfair release is refused at once.

Every collaborator and the auditor call GetPlan first. Its request and reply carry :data:`WIRE_VERSION`; the
aggregator refuses a request of another version (:func:`refusal_details`) and a collaborator or auditor a reply
of another version, each naming both versions and the fix, before a round could fail on a stage one of them
numbers differently. A peer of a release before the wire was versioned sends no version, which reads
:data:`UNVERSIONED`.
"""

from __future__ import annotations

import re

from fedfair.runtime.transport import fedfair_pb2 as pb
from fedfair.runtime.transport.stage_gate import JOIN, make_binding

WIRE_VERSION = 5
"""The version of proto/fedfair.proto this release speaks.

Raise it on every incompatible change of the schema: a stage, action or status added, removed or renumbered,
a field renumbered or its meaning changed. tests/runtime/transport/test_wire_version.py pins it beside a
digest of the Stage enum and the Binding's fields and fails when one changes without the other. Version 2:
STAGE_BOUNDED_VERIFY = 17, the evaluation stages at 18-27. Version 3: a stage is bound by its aggregation (JOIN,
TRAIN, EVALUATE = 3) and its step in the round kind's declaration (Binding.step), not a number of its own.
Version 4: the stages' payloads changed, not the schema: a VERIFY tag carries the count of the values it
reports and a re-checked claim its carries; the input bound's field elements travel at 61 bits and its proof
interpolates at 256 points. An older peer would fail mid-round on bytes it reads otherwise; it is refused at
GetPlan instead. Version 5: the input bound's field is F_(2^52 - 47), its elements travel at 52 bits (the
schema is unchanged); a version-4 peer would read its shares, messages and record as malformed.
"""

UNVERSIONED = 0
"""What a message of a fedfair release before the wire was versioned reads as (proto3's default)."""

FIX = "run the same fedfair version at every party (`fedfair --version` prints it)"
"""What a party refused for its wire version does: the releases must match, not merely be close."""

_REFUSED = "wire version mismatch: this aggregator speaks fedfair wire version {ours}, the caller {theirs}; {fix}"
_REFUSED_PATTERN = re.compile(r"^wire version mismatch: this aggregator speaks fedfair wire version (\d+),")


def describe_version(version: int) -> str:
    """`version` as a message names it; 0 says it is a release from before the wire was versioned."""
    if version == UNVERSIONED:
        return f"version {version} (a fedfair release before the wire was versioned)"
    return f"version {version}"


def plan_request(federation_id: str = "") -> pb.PlanRequest:
    """The GetPlan request of this release: joining `federation_id` ("": whichever the aggregator runs)."""
    return pb.PlanRequest(binding=make_binding(federation_id, 0, JOIN), wire_version=WIRE_VERSION)


def refusal_details(ours: int, theirs: int) -> str:
    """What an aggregator of wire version `ours` tells a caller whose GetPlan spoke `theirs`: both, and the fix."""
    return _REFUSED.format(ours=ours, theirs=describe_version(theirs), fix=FIX)


def refusing_version(details: str | None) -> int | None:
    """The aggregator's wire version if `details` are its :func:`refusal_details`, else None."""
    match = _REFUSED_PATTERN.match(details or "")
    return None if match is None else int(match.group(1))
