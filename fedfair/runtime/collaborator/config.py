"""A collaborator's own file, ``collaborator.toml``: who it is, where the aggregator is, its data.

Read with the same checked tables as the plan (:mod:`fedfair.core.tables`):
every value is checked, an unknown section or key is refused with a suggestion, and
relative paths are relative to the file's folder. ``[certificates]`` is read straight
into the transport's :class:`~fedfair.runtime.transport.TlsFiles` and ``[privacy]``
into :class:`~fedfair.privacy.config.PrivacyConfig`. The training settings are not
here: they come from the aggregator's plan (:func:`fedfair.runtime.plan.aggregator_plan.load_shared_settings`).

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.core.config import FACTORY_PATH
from fedfair.pki.names import FEDERATION_ID_RE, validate_name
from fedfair.privacy.config import MODES, PrivacyConfig
from fedfair.runtime.collaborator.consent import REFUSE_AUDITORS, read_refused_auditors
from fedfair.runtime.peer.retries import DEFAULT_RETRY_POLICY, RetryPolicy, retry_policy
from fedfair.runtime.peer.watchdog import DEFAULT_IDLE_TIMEOUT_SECONDS, idle_timeout
from fedfair.runtime.observe.endpoint import SECTION as MONITORING, MonitoringSettings, parse_monitoring
from fedfair.runtime.manifest import NO_MANIFEST_WARNING, UNPINNED_PLAN_WARNING, Manifest, load_manifest
from fedfair.core.tables import (
    Table,
    check_sections,
    field_names,
    read_toml,
    shown,
)
from fedfair.runtime.transport import TlsFiles

logger = logging.getLogger("fedfair.collaborator")

_DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?|mps|auto")

PRIVACY_KEYS = ("enabled", "mode", "noise_multiplier", "target_epsilon", "max_grad_norm", "delta", "budget_epsilon")
"""The keys of [privacy] that are PrivacyConfig's fields an institution sets (not its test-only ones)."""

SHARE_EPSILON_KEY = "share_epsilon"
"""[privacy] share_epsilon: whether this institution reports its cumulative epsilon to the aggregator
each round. Not a DP-SGD setting, so it lives beside PrivacyConfig, not in it."""

DEFAULT_NOISE_MULTIPLIER = 1.0
"""Sigma when [privacy] names neither noise_multiplier nor target_epsilon."""


DEFAULT_TEST_FRACTION = 0.25
"""The share of an institution's table held out for evaluation unless its [data] says otherwise."""


@dataclass(frozen=True)
class DataSettings:
    """Either a named dataset with a partition and this institution's index, or a CSV file."""

    dataset: str | None = None
    partition: str | None = None
    index: int | None = None
    parts: int | None = None
    alpha: float | None = None
    csv: Path | None = None
    label: str | None = None
    features: tuple[str, ...] | None = None
    group: str | None = None
    test_fraction: float = DEFAULT_TEST_FRACTION
    """The share of a csv table's rows held out from training, for the federated evaluation."""
    recode: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    """[data.recode]: column -> {this table's value -> the plan's}, applied as the table is read
    (:func:`fedfair.datasets.agreement.recoded`), e.g. { readmitted = { yes = "1", no = "0" } }."""


@dataclass(frozen=True)
class CollaboratorConfig:
    """One institution's file.

    ``federation`` (optional) is the federation id it expects to join: with it set, the collaborator refuses an
    aggregator that runs another federation. ``manifest`` (optional) is the agreed roster every round and
    certificate is checked against. ``retry`` bounds how long a lost aggregator is waited for ([retry]),
    ``idle_timeout_seconds`` how long one that answers but sends nothing is ([collaborator]).
    """

    name: str
    aggregator: str
    aggregator_name: str | None
    device: str
    certificates: TlsFiles
    data: DataSettings
    privacy: PrivacyConfig
    source: Path
    federation: str | None = None
    manifest: Manifest | None = None
    retry: RetryPolicy = DEFAULT_RETRY_POLICY
    share_epsilon: bool = False
    """Report the cumulative epsilon to the aggregator each round ([privacy] share_epsilon)."""
    factories: tuple[str, ...] = ()
    """The model factories this institution allows ([model] factories); no other is ever imported."""
    idle_timeout_seconds: float = DEFAULT_IDLE_TIMEOUT_SECONDS
    """Seconds without progress before this collaborator gives up on its aggregator ([collaborator])."""
    monitoring: MonitoringSettings | None = None
    """Where it serves its own privacy metrics ([monitoring]; none unless the section is there)."""
    refused_auditors: tuple[str, ...] = ()
    """The auditors of an input bound this institution refuses ([collaborator] refuse_auditors; consent.py)."""


def parse_collaborator_config(data: Mapping[str, Any], source: Path) -> CollaboratorConfig:
    """Validate a collaborator config already read from TOML."""
    where = str(source)
    base = source.parent
    check_sections(where, data, ("collaborator", "certificates", "data", "privacy", "retry", "model", MONITORING))
    me = Table.of(
        where,
        data,
        "collaborator",
        (
            "name",
            "aggregator",
            "aggregator_name",
            "device",
            "federation",
            "manifest",
            "idle_timeout_seconds",
            REFUSE_AUDITORS,
        ),
    )
    name = me.name("name", validate_name)
    federation = (
        me.string("federation", pattern=FEDERATION_ID_RE, expected="a federation id (letters, digits, '.', '_' or '-')")
        if me.given("federation")
        else None
    )
    aggregator = me.address("aggregator")
    aggregator_name = me.name("aggregator_name", validate_name) if me.given("aggregator_name") else None
    manifest: Manifest | None = None
    if me.given("manifest"):
        try:
            manifest = load_manifest(me.path("manifest", base))
        except ConfigError as error:
            me.fail(f"[collaborator] manifest: {error}")
        if name not in manifest.collaborator_names:
            me.fail(
                f"[collaborator] name = {name!r} is not a collaborator in the manifest {manifest.source}; "
                "use this institution's name there, or the manifest of its federation"
            )
        for key, mine, agreed in (
            ("federation", federation, manifest.federation_id),
            ("aggregator_name", aggregator_name, manifest.aggregator.name),
        ):
            if mine is not None and mine != agreed:
                me.fail(
                    f"[collaborator] {key} = {mine!r} but the manifest {manifest.source} says {agreed!r}; "
                    f"remove {key} (the manifest's is used) or make them equal"
                )
        federation, aggregator_name = manifest.federation_id, manifest.aggregator.name
    device = me.string("device", "auto", pattern=_DEVICE_RE, expected='"cpu", "cuda", "cuda:N", "mps" or "auto"')

    certificates = TlsFiles.from_section(where, data, base, name)
    return CollaboratorConfig(
        name=name,
        aggregator=aggregator,
        aggregator_name=aggregator_name,
        device=device,
        certificates=certificates,
        data=_data(where, data, base),
        privacy=_privacy(where, data),
        source=source,
        federation=federation,
        manifest=manifest,
        retry=retry_policy(where, data),
        share_epsilon=Table.of(where, data, "privacy", (*PRIVACY_KEYS, SHARE_EPSILON_KEY)).boolean(
            SHARE_EPSILON_KEY, False
        ),
        factories=_factories(where, data),
        idle_timeout_seconds=idle_timeout(me),
        monitoring=parse_monitoring(where, data, base),
        refused_auditors=read_refused_auditors(me),
    )


def load_collaborator_config(path: Path | str) -> CollaboratorConfig:
    """Read and validate ``collaborator/collaborator.toml``; warn once when it names no manifest."""
    source, data = read_toml(path)
    config = parse_collaborator_config(data, source)
    if config.manifest is None:
        logger.warning("%s: %s", source, NO_MANIFEST_WARNING)
    elif config.manifest.plan is None:
        logger.warning("%s: %s", config.manifest.source, UNPINNED_PLAN_WARNING)
    return config


def _data(source: str, data: Mapping[str, object], base: Path) -> DataSettings:
    t = Table.of(source, data, "data", field_names(DataSettings))
    dataset = t.string("dataset") if t.given("dataset") else None
    csv = t.path("csv", base) if t.given("csv") else None
    if (dataset is None) == (csv is None):
        t.fail(
            '[data] needs exactly one source: dataset = "adult" (with partition and index) or csv = "path.csv" (with label)'
        )
    if dataset is not None:
        for key in ("label", "features", "group", "test_fraction", "recode"):
            if key in t.data:
                t.fail(f"[data] {key} applies to csv files only; remove it or use csv = ...")
        index = t.integer("index", low=0)
        parts = t.integer("parts", low=1) if t.given("parts") else None
        if parts is not None and index >= parts:
            t.fail(f"[data] index = {index} must be below parts = {parts}; indices count from 0")
        return DataSettings(
            dataset=dataset,
            partition=t.string("partition") if t.given("partition") else None,
            index=index,
            parts=parts,
            alpha=(
                t.number("alpha", check=lambda x: x > 0, expected="a number > 0 (Dirichlet concentration)")
                if t.given("alpha")
                else None
            ),
        )
    for key in ("partition", "index", "parts", "alpha"):
        if key in t.data:
            t.fail(f"[data] {key} applies to named datasets only; a csv file is this institution's data as a whole")
    return DataSettings(
        csv=csv,
        # Without it the plan's [schema] must name the label.
        label=t.string("label") if t.given("label") else None,
        features=t.strings("features") if t.given("features") else None,
        group=t.string("group") if t.given("group") else None,
        test_fraction=t.number(
            "test_fraction",
            DEFAULT_TEST_FRACTION,
            check=lambda x: 0 < x < 1,
            expected="a number in (0, 1) (the share of rows held out for evaluation)",
        ),
        recode=_recode(t),
    )


RECODE_EXAMPLE = '[data.recode] readmitted = { yes = "1", no = "0" }'
"""How a [data.recode] line reads, for its errors."""


def _recode(t: Table) -> dict[str, dict[str, str]]:
    """[data.recode]: column = { this table's value = "the plan's value", ... }, each value compared as text.

    Checked here, once: a table of non-empty tables whose right-hand sides are text (or whole numbers,
    taken as their text). Whether the columns exist is the table's business (checked when it is read).
    """
    if not t.given("recode"):
        return {}
    value = t.data["recode"]
    if not isinstance(value, Mapping) or not value:
        t.bad(
            "recode",
            value,
            f"a table of column = {{ this table's value = \"the plan's value\" }}, e.g. {RECODE_EXAMPLE}",
        )
    recode: dict[str, dict[str, str]] = {}
    for column, mapping in value.items():
        if not isinstance(mapping, Mapping) or not mapping:
            t.fail(
                f"[data.recode] {column} must be a table of this table's value = \"the plan's value\", got "
                f"{shown(mapping)}; write it as {RECODE_EXAMPLE}"
            )
        pairs: dict[str, str] = {}
        for ours, theirs in mapping.items():
            if isinstance(theirs, bool) or not isinstance(theirs, str | int) or theirs == "":
                t.fail(
                    f"[data.recode] {column}: {ours} = {shown(theirs)} must give the plan's value as text, e.g. "
                    f'{ours} = "1"; fix the value'
                )
            pairs[str(ours)] = str(theirs)
        recode[str(column)] = pairs
    return recode


def _factories(source: str, data: Mapping[str, object]) -> tuple[str, ...]:
    """[model] factories: the model factories this institution consents to import, each "package.module:function"."""
    t = Table.of(source, data, "model", ("factories",))
    factories = t.strings("factories") if t.given("factories") else ()
    for factory in factories:
        if not FACTORY_PATH.fullmatch(factory):
            t.fail(
                f"[model] factories: {factory!r} is not of the form 'package.module:function'; "
                "write the module's import name, a colon and the function, e.g. 'mymodels.tabular:build'"
            )
    return factories


def _privacy(source: str, data: Mapping[str, object]) -> PrivacyConfig:
    t = Table.of(source, data, "privacy", (*PRIVACY_KEYS, SHARE_EPSILON_KEY))
    d = PrivacyConfig()

    def positive(key: str) -> float | None:
        return t.number(key, check=lambda x: x > 0, expected="a number > 0") if t.given(key) else None

    enabled = t.boolean("enabled", d.enabled)
    noise_multiplier = t.number(
        "noise_multiplier", DEFAULT_NOISE_MULTIPLIER, check=lambda x: x >= 0, expected="a number >= 0"
    )
    target_epsilon = positive("target_epsilon")
    return PrivacyConfig(
        enabled=enabled,
        # "distributed": this institution's floor on a plan's noise inside the secure sum (its target_epsilon
        # and delta), which it then trains under (fedfair.runtime.plan.privacy.privacy_shortfall).
        mode=t.string("mode", d.mode, choices=MODES),
        # A target epsilon calibrates the noise, so it takes the place of noise_multiplier (even one
        # written in the file: the template's noise_multiplier = 1.0 stays when target_epsilon is set).
        noise_multiplier=None if target_epsilon is not None else noise_multiplier,
        target_epsilon=target_epsilon,
        max_grad_norm=t.number("max_grad_norm", d.max_grad_norm, check=lambda x: x > 0, expected="a number > 0"),
        delta=t.number("delta", d.delta, check=lambda x: 0 < x < 1, expected="a number in (0, 1)"),
        budget_epsilon=positive("budget_epsilon"),
    )
