"""The aggregator's ``plan.toml``: parse, load with overrides, share with collaborators, fingerprint.

A plan is the federation's id and allow-list of names, the aggregator's own node
(address and folders, resolved against the plan's folder so a workspace can be
moved as a whole, and optionally the federation manifest, which the plan must then
agree with: :mod:`fedfair.runtime.manifest`) and the learning sections of
:mod:`fedfair.runtime.plan.learning_settings`. Every value is checked; an unknown section or key is
refused with the closest known name as a suggestion (:mod:`fedfair.core.tables`).

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfair.core.config import TrainingConfig
from fedfair.core.errors import ConfigError, ManifestError
from fedfair.datasets.schema import Schema
from fedfair.pki import validate_name
from fedfair.pki.names import FEDERATION_ID_RE
from fedfair.pki.roster import canonical_json
from fedfair.runtime.manifest import Manifest, check_federation, federation_digest, load_manifest
from fedfair.runtime.manifest_plan import check_bounds, check_pinned_settings
from fedfair.runtime.plan import bounded_check as bounded_check  # registers the bounded sum's plan check
from fedfair.runtime.plan.input_bound import NO_INPUT_BOUND, check_auditor_independent
from fedfair.runtime.plan.kind_checks import check_plan_at_size
from fedfair.runtime.plan.limits import MAX_COLLABORATORS
from fedfair.runtime.plan.privacy import PlanPrivacy
from fedfair.runtime.plan.learning_settings import LEARNING_SECTIONS, LearningSettings, read_learning
from fedfair.runtime.observe.endpoint import SECTION as MONITORING, MonitoringSettings, parse_monitoring
from fedfair.runtime.plan.training import training_table
from fedfair.core.tables import (
    Table,
    check_sections,
    field_names,
    parse_json_object,
    read_toml,
)


@dataclass(frozen=True)
class AggregatorSettings:
    """Where the aggregator listens and keeps its files (paths resolved against the plan).

    It also names the federation manifest it checks the plan against, if any (:mod:`fedfair.runtime.manifest`).
    """

    address: str
    name: str
    certs: Path
    output: Path
    manifest: Path | None = None
    report: bool = True
    """Draw the HTML report (``report.html``) into `output` at the end of the run. ``fedfair report`` draws the
    same page from the folder at any time, so a headless aggregator may skip it (it takes about 1.5 CPU-s)."""


@dataclass(frozen=True)
class AggregatorPlan(LearningSettings):
    """The whole plan: the learning sections, the federation's names and the aggregator's node."""

    federation_id: str
    collaborators: tuple[str, ...]
    aggregator: AggregatorSettings
    source: Path
    manifest: Manifest | None = None
    """The manifest ``[aggregator] manifest`` names, already checked against this plan."""
    monitoring: MonitoringSettings | None = None
    """Where the aggregator serves its metrics and status page ([monitoring]; deployment, not in the digest)."""

    @property
    def own_factories(self) -> tuple[str, ...]:
        """The model factory the operator's own plan names.

        The aggregator's consent to import it (fedfair.core.models.load_factory); a collaborator's consent is
        its own config's.
        """
        return () if self.model.factory is None else (self.model.factory,)


@dataclass(frozen=True)
class SharedSettings(LearningSettings):
    """What collaborators learn of the plan: the learning sections, not names or paths."""

    federation_id: str
    collaborator_count: int


# ---------------------------------------------------------------- the aggregator's file


def parse_aggregator_plan(data: Mapping[str, Any], source: Path, *, check_manifest: bool = True) -> AggregatorPlan:
    """Validate an aggregator plan already read from TOML (``source`` for messages and paths).

    With ``check_manifest`` False a plan is not held to, nor even read with, the manifest it names (to pin an
    edited plan anew, or for the first time, before that manifest exists).
    """
    where = str(source)
    check_sections(where, data, ("federation", "aggregator", MONITORING, *LEARNING_SECTIONS))
    federation = Table.of(where, data, "federation", ("id", "collaborators"))
    federation_id = federation.string("id", pattern=FEDERATION_ID_RE, expected="letters, digits, '.', '_' or '-'")
    names = federation.strings("collaborators")
    for name in names:
        try:
            validate_name(name)
        except ConfigError as error:
            federation.fail(f"[federation] collaborators: {error}")
    if len(set(names)) != len(names):
        federation.fail("[federation] collaborators lists a name twice; list each institution once")
    node = Table.of(where, data, "aggregator", field_names(AggregatorSettings))
    base = source.parent
    aggregator = AggregatorSettings(
        address=node.address("address", "0.0.0.0:50051"),
        name=node.name("name", validate_name, "aggregator"),
        certs=node.path("certs", base, "../certs"),
        output=node.path("output", base, "output"),
        manifest=node.path("manifest", base) if node.given("manifest") else None,
        report=node.boolean("report", True),
    )
    if aggregator.name in names:
        node.fail(f"[aggregator] name {aggregator.name!r} is also a collaborator; give the aggregator its own name")
    manifest: Manifest | None = None
    # A plan being pinned may name the manifest the pin is about to write: it is not read then.
    if aggregator.manifest is not None and check_manifest:
        try:
            manifest = load_manifest(aggregator.manifest)
        except ConfigError as error:
            node.fail(f"[aggregator] manifest: {error}")
    loaded = AggregatorPlan(
        federation_id=federation_id,
        collaborators=names,
        aggregator=aggregator,
        source=source,
        manifest=manifest,
        monitoring=parse_monitoring(where, data, base),
        **read_learning(where, data, len(names)).learning_sections(),
    )
    declared = set(loaded.influence.sizes)
    if declared and declared != set(names):
        missing, unknown = sorted(set(names) - declared), sorted(declared - set(names))
        raise ConfigError(
            f"{where}: [influence] sizes must declare exactly the collaborators; missing {missing or 'none'}, "
            f"not collaborators {unknown or 'none'}"
        )
    auditor = loaded.secure_aggregation.auditor
    check_auditor_independent(auditor, aggregator.name, names, where)
    # A plan being pinned is held to the manifest the pin writes (which must list its auditor) instead.
    if auditor is not None and aggregator.manifest is None and check_manifest:
        node.fail(
            f"[secure_aggregation] auditor = {auditor!r} must be an institution the manifest pins, but the plan "
            "names no manifest; set [aggregator] manifest to the federation's manifest that lists the auditor"
        )
    if loaded.manifest is not None and check_manifest:
        check_plan(loaded.manifest, loaded, shared_content(loaded))
    check_plan_at_size(loaded, len(names), where)  # the model is not built yet: the kind's bounds alone
    return loaded


def model_parameters(plan: AggregatorPlan) -> int:
    """The numbers in the plan's model, built as round 0's (the model's size fixes the round's dimension)."""
    from fedfair.core.models import flat_parameters  # torch, only where a model is built

    model = plan.model.build(seed=plan.training.seed, allowed=plan.own_factories)
    return int(flat_parameters(model).numel())


def check_plan(manifest: Manifest, plan: AggregatorPlan, served: Mapping[str, Any]) -> None:
    """At the aggregator.

    Refuse a plan that disagrees with the manifest it names (``served``: the settings it would share, as JSON
    values), at start rather than at every collaborator.
    """
    where = str(plan.source)
    check_federation(manifest, plan.federation_id, where)
    check_pinned_settings(manifest, served, where)
    # Before the roster's comparison: an auditor whose certificate was requested as a collaborator's is listed among
    # the manifest's collaborators, and "list exactly the manifest's collaborators" would make it train.
    check_bounds(manifest, plan, where)
    listed = manifest.collaborator_names
    planned = frozenset(plan.collaborators)
    for names, what in ((planned - listed, "lists"), (listed - planned, "leaves out")):
        if names:
            raise ManifestError(
                f"{where}: [federation] collaborators {what} {', '.join(repr(name) for name in sorted(names))} "
                f"unlike the manifest {manifest.source}; list exactly the manifest's collaborators"
            )
    if plan.aggregator.name != manifest.aggregator.name:
        raise ManifestError(
            f"{where}: [aggregator] name = {plan.aggregator.name!r} but the manifest {manifest.source} names "
            f"{manifest.aggregator.name!r}; use the manifest's name"
        )


def load_aggregator_plan(
    path: Path | str | None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    check_manifest: bool = True,
) -> AggregatorPlan:
    """Read and validate ``aggregator/plan.toml``.

    ``overrides`` maps section -> key -> value and replaces the file's values before
    validation (command-line flags), so overridden values get the same checks. With
    ``path`` None the plan is the defaults plus the overrides, and relative paths are
    relative to the current folder.
    """
    data: dict[str, Any]
    if path is None:
        source, data = Path.cwd() / "(command-line plan)", {}
    else:
        source, data = read_toml(path)
    for section, values in (overrides or {}).items():
        table = data.setdefault(section, {})
        if isinstance(table, dict):
            table.update(values)
    return parse_aggregator_plan(data, source, check_manifest=check_manifest)


# ---------------------------------------------------------------- sharing and fingerprints


def _plain(settings: LearningSettings) -> dict[str, Any]:
    """The learning sections as JSON values (tuples as lists)."""
    sections = {
        name: section.to_mapping()
        if isinstance(section, Schema)
        else training_table(section)
        if isinstance(section, TrainingConfig)
        else dataclasses.asdict(section)
        for name, section in settings.learning_sections().items()
        if section is not None
    }
    loaded: dict[str, Any] = json.loads(json.dumps(sections))
    if settings.schema is not None:
        # The encoder decides the input size; a plan with a [schema] may not state one (settings._schema).
        loaded["model"].pop("features", None)
    if settings.secure_aggregation.tolerates_dropouts:
        # Left out at its default, like drift_correction below (digests and resumes unchanged).
        loaded["secure_aggregation"].pop("dropouts")
    if settings.secure_aggregation.input_bound == NO_INPUT_BOUND:
        # Left out when off, like dropouts: digests unchanged (the auditor is then unset).
        loaded["secure_aggregation"].pop("input_bound")
        loaded["secure_aggregation"].pop("auditor")
    if settings.secure_aggregation.round_kind is None:
        loaded["secure_aggregation"].pop("round_kind")  # left out when unset, like input_bound: digests unchanged
    if settings.quorum.grace_factor is None:
        loaded["quorum"].pop("grace_factor")  # left out when unset, like dropouts: digests unchanged
    if settings.quorum.aborted_rounds_allowed == 0:
        loaded["quorum"].pop("aborted_rounds_allowed")  # left out at its default, like grace_factor
    if settings.privacy == PlanPrivacy():
        loaded.pop("privacy")  # left out when nothing is noised, like composition below: digests unchanged
    elif settings.privacy.interim_report_epsilon is None:
        # Left out when unset (every answer at report_epsilon, as before the setting): digests unchanged.
        loaded["privacy"].pop("interim_report_epsilon")
    if not settings.evaluation.composition:
        # Left out when empty (the stage off), like drift_correction below: digests unchanged.
        loaded["evaluation"].pop("composition")
    if settings.training.server_momentum == 0.0:
        # Algorithm 1's step, as every plan took before the setting existed: its checkpoints still resume.
        loaded["training"].pop("server_momentum")
    if not settings.training.local.corrects_drift:
        # Left out at its default, so a plan without drift correction keeps the digest (and its checkpoints
        # resume) and the shared bytes it had before the setting existed; a collaborator that does not know
        # the setting is refused only by a plan that turns it on (an unknown [training] key).
        loaded["training"].pop("drift_correction")
    return loaded


def shared_content(plan: AggregatorPlan) -> dict[str, Any]:
    """What collaborators need of the plan as JSON values: no names, no paths. A manifest pins exactly this."""
    content = _plain(plan)
    content["federation"] = {"id": plan.federation_id, "collaborator_count": len(plan.collaborators)}
    return content


def shared_settings(plan: AggregatorPlan) -> bytes:
    """Canonical JSON of :func:`shared_content` (PlanReply.settings)."""
    return canonical_json(shared_content(plan))


def json_object(payload: bytes, source: str) -> dict[str, Any]:
    """A JSON object the aggregator sent (its plan, its encoder); a ConfigError naming `source` otherwise."""
    return parse_json_object(payload, source, "the aggregator and collaborator versions may differ")


def load_shared_settings(payload: bytes, source: str = "the aggregator's plan") -> SharedSettings:
    """Parse and re-validate PlanReply.settings on the collaborator's side."""
    data = json_object(payload, source)
    check_sections(source, data, ("federation", *LEARNING_SECTIONS))
    federation = Table.of(source, data, "federation", ("id", "collaborator_count"))
    count = federation.integer("collaborator_count", low=1, high=MAX_COLLABORATORS)
    sections = read_learning(source, data, count).learning_sections()
    training = data.get("training")
    if isinstance(training, dict) and "server_momentum" not in training:
        # shared_content leaves Algorithm 1's step (momentum 0) out: absent here, it is that step, not the plan
        # file's default (a site's model chain applies the server step itself).
        sections["training"] = dataclasses.replace(sections["training"], server_momentum=0.0)
    return SharedSettings(
        federation_id=federation.string("id", pattern=FEDERATION_ID_RE), collaborator_count=count, **sections
    )


def plan_content(plan: AggregatorPlan) -> dict[str, Any]:
    """The plan's canonical content.

    The learning sections (command-line overrides applied), the federation id, the allowed names and the
    manifest's digest when the plan names one. Deployment details (address, folders, where the manifest lies)
    are left out, so a moved workspace still resumes from its checkpoints, but not under another manifest.
    """
    content = _plain(plan)
    content["federation"] = {"id": plan.federation_id, "collaborators": list(plan.collaborators)}
    if plan.manifest is not None:
        # The first manifest's digest: a signed roster update (a re-keyed site) keeps the federation's identity.
        content["federation"]["manifest"] = federation_digest(plan.manifest)
    return content


def plan_digest(plan: AggregatorPlan) -> str:
    """sha256 (hex) of :func:`plan_content`: what a checkpoint is written under."""
    return hashlib.sha256(canonical_json(plan_content(plan))).hexdigest()
