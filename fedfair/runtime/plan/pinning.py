"""Pinning the agreed plan in the federation manifest, seeing what a new one changes, renewing a federation.

Every collaborator refuses a plan other than the one its manifest pins
(:func:`fedfair.runtime.manifest_plan.check_shared_settings`), so changing the plan is a new
manifest that every institution accepts (``fedfair plan pin``; with ``--config FILE ...`` it also
writes ``manifest = "PATH"`` into the configs it is given).

``fedfair plan renew`` starts a *new federation* from the same sites and certificates: a new
federation id in the plan (and in the collaborator configs it is given), a fresh output folder,
and a new manifest pinning the plan under the new id. Everything a federation id keys starts
afresh with it: the collaborators' bindings (files named after the id), the aggregator's
checkpoint and round log; each site's privacy ledger is its data's and continues.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.pki.names import validate_federation_id
from fedfair.pki.roster import PARTICIPANTS, PlanPin, write_manifest
from fedfair.core.tables import read_toml

# The plan and manifest modules read schemas (pandas): imported where a command runs, so that
# `fedfair plan --help` answers at once.


def pin_plan(
    plan_path: Path,
    manifest_path: Path,
    out: Path,
    *,
    federation_id: str | None = None,
    configs: Sequence[Path] = (),
) -> tuple[str, list[str] | None]:
    """Write to ``out`` the manifest at ``manifest_path`` with the plan at ``plan_path`` pinned.

    Under ``federation_id`` instead of the manifest's, when given: a new federation of the same roster.
    Each of `configs` (a plan.toml, a collaborator.toml or an auditor.toml) then names ``out`` as its manifest
    (:func:`name_manifest`); a config that cannot is refused before anything is written.

    The plan is read without holding it to the manifest it names (it is the edit being pinned) and then checked
    against the new manifest like any plan; where its training kind checks a plan at the model's size (the input
    bound's: the proof's field) its model is built, so a model too large is refused here, not at every round.
    Returns the new manifest's digest and the fields that changed since the old pin (None: it pinned none).
    """
    named = {config: name_manifest(config, out) for config in configs}
    from fedfair.runtime.manifest import load_manifest, manifest_digest
    from fedfair.runtime.manifest_plan import setting_differences
    from fedfair.runtime.plan.aggregator_plan import check_plan, load_aggregator_plan, model_parameters, shared_content
    from fedfair.runtime.plan.kind_checks import check_plan_at_size, checks_plan_at_size

    plan = load_aggregator_plan(plan_path, check_manifest=False)
    if checks_plan_at_size(plan):  # the round's dimension too: a model too large for the kind's rounds
        check_plan_at_size(plan, len(plan.collaborators), str(plan_path), model_parameters(plan))
    roster = load_manifest(manifest_path)
    content = shared_content(plan)
    pinned = dataclasses.replace(
        roster, plan=PlanPin(content), source=out, federation_id=federation_id or roster.federation_id
    )
    check_plan(pinned, plan, content)
    write_manifest(out, pinned.roster)
    changes = None if roster.plan is None else setting_differences(roster.plan.settings, content)
    for config, text in named.items():
        config.write_text(text, encoding="utf-8")
    return manifest_digest(pinned), changes


MANIFEST_KEY_TABLES = ("collaborator", "aggregator", "auditor")
"""Where a config names its manifest: a collaborator.toml in [collaborator], a plan in [aggregator], an auditor.toml
in [auditor]."""


def name_manifest(config: Path, manifest: Path) -> str:
    """The text of `config` (a collaborator.toml, a plan.toml or an auditor.toml) with its manifest key naming `manifest`.

    The path is written relative to the config's folder (as every relative path in it is read), in the
    key of [collaborator], [aggregator] or [auditor], replacing the key or the template's commented example.

    Raises:
        ConfigError: the file is none of the three.
    """
    _, data = read_toml(config)
    table = next((name for name in MANIFEST_KEY_TABLES if isinstance(data.get(name), dict)), None)
    if table is None:
        raise ConfigError(
            f"--config {config} has no [collaborator], [aggregator] or [auditor] table; give a collaborator.toml, "
            "the aggregator's plan.toml or the auditor's auditor.toml"
        )
    relative = Path(os.path.relpath(manifest.resolve(), config.resolve().parent)).as_posix()
    return set_value(config.read_text(encoding="utf-8"), table, "manifest", json.dumps(relative), config)


def settings_of(path: Path) -> dict[str, Any]:
    """The shared settings a file stands for: a manifest's pinned plan, or what a plan would share."""
    from fedfair.runtime.manifest import load_manifest
    from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, shared_content

    _, data = read_toml(path)
    if PARTICIPANTS in data:
        manifest = load_manifest(path)
        if manifest.plan is None:
            raise ConfigError(f"{path} pins no plan; pin one with `fedfair plan pin`")
        return dict(manifest.plan.settings)
    return shared_content(load_aggregator_plan(path, check_manifest=False))


def set_value(text: str, table: str, key: str, literal: str, source: Path) -> str:
    """`text` (a TOML file's) with ``key`` of ``[table]`` set to `literal`, its comment kept.

    Absent, the key takes the place of the table's commented example of it (``# key = ...``, as the
    templates write one), or is added under the table's header. ConfigError when the table is not there.
    """
    lines = text.splitlines(keepends=True)
    header = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")
    assignment = re.compile(rf"^(\s*{re.escape(key)}\s*=\s*)(\"[^\"]*\"|'[^']*')(.*)$", re.DOTALL)
    example = re.compile(rf"^#\s*({re.escape(key)}\s*=\s*)(\"[^\"]*\"|'[^']*')(.*)$", re.DOTALL)
    current, start, commented = None, None, None
    for index, line in enumerate(lines):
        found = header.match(line)
        if found:
            current = found.group(1).strip()
            start = index if current == table else start
            continue
        matched = assignment.match(line) if current == table else None
        if matched:
            lines[index] = matched.group(1) + literal + matched.group(3)
            return "".join(lines)
        if current == table and commented is None and example.match(line):
            commented = index
    if start is None:
        raise ConfigError(f"{source} has no [{table}] table; add it with {key} = {literal}")
    if commented is not None:
        matched = example.match(lines[commented])
        assert matched is not None
        lines[commented] = matched.group(1) + literal + matched.group(3)
    else:
        lines.insert(start + 1, f"{key} = {literal}\n")
    return "".join(lines)


def renew_federation(
    plan_path: Path, manifest_path: Path, federation_id: str, out: Path, configs: list[Path]
) -> tuple[str, Path, list[str] | None]:
    """A new federation of the same roster.

    The plan (and `configs`) under `federation_id`, with the output folder ``output-<id>``; the manifest at
    `out` pins it. Nothing is changed unless all of it succeeds. Returns the new manifest's digest, the
    output folder, and the plan's changes since the pin at `manifest_path` (None: it pinned none), so
    that edits made since are shown, not carried silently.
    """
    validate_federation_id(federation_id)
    if out.exists():
        raise ConfigError(f"{out} exists; choose a new file for the new federation's manifest (--out)")
    output = f"output-{federation_id}"
    literal = json.dumps(federation_id)  # a checked id: JSON quoting is TOML quoting
    originals = {path: path.read_text(encoding="utf-8") for path in (plan_path, *configs)}
    renewed = {plan_path: set_value(originals[plan_path], "federation", "id", literal, plan_path)}
    renewed[plan_path] = set_value(renewed[plan_path], "aggregator", "output", json.dumps(output), plan_path)
    for config in configs:
        renewed[config] = set_value(originals[config], "collaborator", "federation", literal, config)
    if (plan_path.parent / output).exists():
        raise ConfigError(f"{plan_path.parent / output} exists; choose another federation id")
    try:
        for path, text in renewed.items():
            path.write_text(text, encoding="utf-8")
        digest, changes = pin_plan(plan_path, manifest_path, out, federation_id=federation_id)
    except BaseException:
        for path, text in originals.items():
            path.write_text(text, encoding="utf-8")
        raise
    return digest, plan_path.parent / output, changes
