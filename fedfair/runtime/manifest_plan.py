"""A plan held against its federation's manifest: the agreed bounds, the pinned plan, what differs.

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from fedfair.core.errors import ManifestError
from fedfair.pki.roster import settings_digest
from fedfair.runtime.manifest import Manifest, check_federation


class Colluding(Protocol):
    """A [secure_aggregation] section (fedfair.runtime.plan.learning_settings.SecureAggregationSettings)."""

    @property
    def max_colluding(self) -> int:
        """How many collaborators the section assumes may collude with the aggregator."""

    @property
    def enabled(self) -> bool:
        """Whether the section secures the sum at all."""

    @property
    def auditor(self) -> str | None:
        """The second verifier of the input bound (fedfair.runtime.plan.input_bound), or None."""


class Quorum(Protocol):
    """A [quorum] section (fedfair.runtime.plan.learning_settings.QuorumSettings)."""

    @property
    def min_collaborators(self) -> int:
        """How many collaborators a round needs."""


class Bounded(Protocol):
    """The settings a manifest bounds (a plan's or the shared settings' learning sections)."""

    @property
    def secure_aggregation(self) -> Colluding:
        """The [secure_aggregation] section, whose max_colluding the manifest bounds."""

    @property
    def quorum(self) -> Quorum:
        """The [quorum] section, whose min_collaborators the manifest bounds."""


class Shared(Bounded, Protocol):
    """What a collaborator checks of the aggregator's shared settings (fedfair.runtime.plan.aggregator_plan.SharedSettings)."""

    @property
    def federation_id(self) -> str:
        """The federation the settings are for, checked against the manifest's."""

    @property
    def collaborator_count(self) -> int:
        """How many collaborators the settings' roster names, checked against the manifest's."""


def check_bounds(manifest: Manifest, learning: Bounded, where: str) -> None:
    """The plan's collusion bound is the manifest's, and its quorum never starts a round the manifest refuses.

    The auditor its input bound names, if any, is an auditor institution of the manifest (:func:`check_auditor`).
    """
    check_auditor(manifest, learning.secure_aggregation.auditor, where)
    declared = learning.secure_aggregation.max_colluding
    if declared != manifest.max_colluding:
        raise ManifestError(
            f"{where}: [secure_aggregation] max_colluding = {declared} but the manifest {manifest.source} says "
            f"{manifest.max_colluding}; the plan must use the bound the institutions agreed on"
        )
    quorum = learning.quorum.min_collaborators
    if quorum < manifest.min_round_size:
        raise ManifestError(
            f"{where}: [quorum] min_collaborators = {quorum} is below min_round_size = {manifest.min_round_size} "
            f"in the manifest {manifest.source}; raise it to at least {manifest.min_round_size}"
        )


def check_auditor(manifest: Manifest, auditor: str | None, where: str) -> None:
    """The plan's [secure_aggregation] auditor is a participant of the manifest with the role "auditor".

    Not the aggregator, nor a collaborator: the second verifier is independent of the aggregator, and no site
    that max_colluding lets collude with it (fedfair.runtime.plan.input_bound says why).
    """
    if auditor is None:
        return
    pin = manifest.pin(auditor)
    if pin is None:
        raise ManifestError(
            f"{where}: [secure_aggregation] auditor = {auditor!r} is not an institution in the manifest "
            f"{manifest.source}; the institutions must agree on the auditor and its certificate: add it to the "
            '[[participants]] with role = "auditor" (`fedfair pki request --role auditor` at the auditor, '
            "`fedfair pki sign`, then `fedfair pki manifest`)"
        )
    if pin.role != "auditor":
        raise ManifestError(
            f"{where}: [secure_aggregation] auditor = {auditor!r} is the manifest's {pin.role}, but the second "
            "verifier must be independent of the aggregator and of every site that may collude with it: name an "
            'institution the manifest lists with role = "auditor"; if its certificate was requested for the wrong '
            f"role, request one with `fedfair pki request --name {auditor} --role auditor`, have it signed and run "
            "`fedfair pki manifest` again"
        )


def setting_differences(pinned: Mapping[str, Any], served: Mapping[str, Any]) -> list[str]:
    """Every field where two plans' settings differ, as "section.key: pinned -> served" lines, sorted."""
    flat_pinned, flat_served = _flatten(pinned), _flatten(served)
    for flat, other in ((flat_pinned, flat_served), (flat_served, flat_pinned)):
        # An empty table on one side shows as its entries on the other ({} -> {"a": 1} is "t.a: (absent) -> 1").
        for path in [path for path, value in flat.items() if value == {}]:
            if any(key.startswith(f"{path}.") for key in other):
                del flat[path]
    lines = []
    for field in sorted(flat_pinned.keys() | flat_served.keys()):
        before, after = flat_pinned.get(field, _ABSENT), flat_served.get(field, _ABSENT)
        if before != after:
            lines += _list_differences(field, before, after) or [f"{field}: {_shown(before)} -> {_shown(after)}"]
    return lines


def _list_differences(field: str, before: Any, after: Any) -> list[str] | None:
    """Two lists told apart in full, not as two truncated texts.

    Entries with a "name" (a schema's columns) entry by entry, plain values by what was added and removed; None
    for anything else.
    """
    if not (isinstance(before, list) and isinstance(after, list)):
        return None
    if all(isinstance(entry, Mapping) and "name" in entry for entry in before + after):
        old = {str(entry["name"]): entry for entry in before}
        new = {str(entry["name"]): entry for entry in after}
        lines = [f"{field}[{name}]: removed" for name in old.keys() - new.keys()]
        lines += [f"{field}[{name}]: added {_shown(new[name])}" for name in new.keys() - old.keys()]
        for name in old.keys() & new.keys():
            lines += [f"{field}[{name}].{line}" for line in setting_differences(old[name], new[name])]
        if [name for name in old if name in new] != [name for name in new if name in old]:
            lines.append(f"{field}: order {_shown(list(old))} -> {_shown(list(new))}")
        return sorted(lines)
    if any(isinstance(entry, (Mapping, list)) for entry in before + after):
        return None
    added = [entry for entry in after if entry not in before]
    removed = [entry for entry in before if entry not in after]
    if not added and not removed:
        return [f"{field}: the same values, order {_shown(before)} -> {_shown(after)}"]
    said = [f"added {json.dumps(added, ensure_ascii=False)}"] * bool(added)
    said += [f"removed {json.dumps(removed, ensure_ascii=False)}"] * bool(removed)
    return [f"{field}: {', '.join(said)}"]


_ABSENT = object()


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A JSON object's leaves by dotted path (lists are leaves: a schema's column list is one field)."""
    if isinstance(value, Mapping) and (value or not prefix):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def check_pinned_settings(manifest: Manifest, served: Mapping[str, Any], where: str) -> None:
    """Refuse settings (a plan's shared settings as JSON values) unless they are the manifest's pinned plan.

    The refusal names every field that differs. A manifest without [plan] pins nothing here.
    """
    if manifest.plan is None or settings_digest(served) == manifest.plan.sha256:
        return
    differences = setting_differences(manifest.plan.settings, served)
    shown = "; ".join(differences[:12]) + (f"; and {len(differences) - 12} more" if len(differences) > 12 else "")
    raise ManifestError(
        f"{where} is not the plan pinned by the manifest {manifest.source} (pinned -> served: {shown}); a plan "
        "changes only by a new manifest that every institution accepts (`fedfair plan pin`, then compare with "
        "`fedfair plan diff OLD NEW`)"
    )


def check_shared_settings(manifest: Manifest, shared: Shared, served: Mapping[str, Any]) -> None:
    """At a collaborator.

    Refuse the aggregator's shared settings unless they agree with its own manifest: exactly the pinned plan
    (``served`` is what arrived, as JSON values), and in any case the roster's bounds.

    The shared settings carry no names (the aggregator never reveals its allow-list),
    so the names themselves are checked on every round's roster.
    """
    where = "the aggregator's plan"
    check_pinned_settings(manifest, served, where)
    check_federation(manifest, shared.federation_id, where)
    if shared.collaborator_count != len(manifest.collaborators):
        raise ManifestError(
            f"{where}: {shared.collaborator_count} collaborators, but the manifest {manifest.source} lists "
            f"{len(manifest.collaborators)}; the aggregator's roster is not the one agreed on"
        )
    check_bounds(manifest, shared, where)
    if not shared.secure_aggregation.enabled:
        raise ManifestError(
            f"{where}: secure aggregation is off, so the aggregator would see this institution's update in the "
            f"clear; the manifest {manifest.source} promises a secured roster: turn [secure_aggregation] enabled "
            "back on in the plan"
        )
