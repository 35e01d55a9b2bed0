"""``fedfair plan pin | diff``: pin the agreed plan in the federation manifest, and see what a new one changes.

Every collaborator refuses a plan other than the one its manifest pins
(:func:`fedfair.runtime.manifest.check_shared_settings`), so changing the plan is a new
manifest that every institution accepts. The operator's everyday edit is therefore:

``fedfair plan renew`` starts a *new federation* from the same sites and certificates: a new
federation id in the plan (and in the collaborator configs it is given), a fresh output folder,
and a new manifest pinning the plan under the new id. Everything a federation id keys starts
afresh with it: the collaborators' bindings and privacy ledgers (files named after the id), the
aggregator's checkpoint and round log. It is the way to run a finished federation again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.pki.names import validate_federation_id
from fedfair.pki.roster import PARTICIPANTS, PlanPin, write_manifest
from fedfair.runtime.toml_tables import read_toml

# The plan and manifest modules read schemas (pandas): imported where a command runs, so that
# `fedfair plan --help` answers at once.


def pin_plan(
    plan_path: Path, manifest_path: Path, out: Path, *, federation_id: str | None = None
) -> tuple[str, list[str] | None]:
    """Write to ``out`` the manifest at ``manifest_path`` with the plan at ``plan_path`` pinned (under
    ``federation_id`` instead of the manifest's, when given: a new federation of the same roster).

    The plan is read without holding it to the manifest it names (it is the edit being
    pinned) and then checked against the new manifest like any plan. Returns the new
    manifest's digest and the fields that changed since the old pin (None: it pinned none).
    """
    from fedfair.runtime.manifest import load_manifest, manifest_digest, setting_differences
    from fedfair.runtime.plan import check_plan, load_aggregator_plan, shared_content

    plan = load_aggregator_plan(plan_path, check_manifest=False)
    roster = load_manifest(manifest_path)
    content = shared_content(plan)
    pinned = dataclasses.replace(
        roster, plan=PlanPin(content), source=out, federation_id=federation_id or roster.federation_id
    )
    check_plan(pinned, plan, content)
    write_manifest(
        out,
        pinned.federation_id,
        (pinned.aggregator, *pinned.collaborators),
        pinned.max_colluding,
        pinned.min_round_size,
        pinned.plan,
    )
    changes = None if roster.plan is None else setting_differences(roster.plan.settings, content)
    return manifest_digest(pinned), changes


def settings_of(path: Path) -> dict[str, Any]:
    """The shared settings a file stands for: a manifest's pinned plan, or what a plan would share."""
    from fedfair.runtime.manifest import load_manifest
    from fedfair.runtime.plan import load_aggregator_plan, shared_content

    _, data = read_toml(path)
    if PARTICIPANTS in data:
        manifest = load_manifest(path)
        if manifest.plan is None:
            raise ConfigError(f"{path} pins no plan; pin one with `fedfair plan pin`")
        return dict(manifest.plan.settings)
    return shared_content(load_aggregator_plan(path, check_manifest=False))


def _pin_command(args: argparse.Namespace) -> int:
    digest, changes = pin_plan(args.plan, args.manifest, args.out)
    print(f"wrote {args.out}: {args.manifest} with the plan {args.plan} pinned")
    if changes is None:
        print("the plan is pinned for the first time")
    elif not changes:
        print("the plan is the one already pinned: nothing changed")
    else:
        print("changed since the old pin (old -> new):")
        for line in changes:
            print(f"  {line}")
    print(f"manifest sha256 {digest}")
    print("next: every institution reviews `fedfair plan diff OLD NEW`, compares the digest out of band and keeps a copy")
    return 0


def set_value(text: str, table: str, key: str, literal: str, source: Path) -> str:
    """`text` (a TOML file's) with ``key`` of ``[table]`` set to `literal`, its comment kept.

    The key is added under the table's header when absent. ConfigError when the table is not there.
    """
    lines = text.splitlines(keepends=True)
    header = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")
    assignment = re.compile(rf"^(\s*{re.escape(key)}\s*=\s*)(\"[^\"]*\"|'[^']*')(.*)$", re.DOTALL)
    current, start = None, None
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
    if start is None:
        raise ConfigError(f"{source} has no [{table}] table; add it with {key} = {literal}")
    lines.insert(start + 1, f"{key} = {literal}\n")
    return "".join(lines)


def renew_federation(
    plan_path: Path, manifest_path: Path, federation_id: str, out: Path, configs: list[Path]
) -> tuple[str, Path]:
    """A new federation of the same roster.

    The plan (and `configs`) under `federation_id`, with the output folder ``output-<id>``; the manifest at
    `out` pins it. Nothing is changed unless all of it succeeds. Returns the new manifest's digest and the
    output folder.
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
        digest, _ = pin_plan(plan_path, manifest_path, out, federation_id=federation_id)
    except BaseException:
        for path, text in originals.items():
            path.write_text(text, encoding="utf-8")
        raise
    return digest, plan_path.parent / output


def _renew_command(args: argparse.Namespace) -> int:
    configs = list(args.config or [])
    digest, output = renew_federation(args.plan, args.manifest, args.federation, args.out, configs)
    print(f"federation {args.federation}: {args.plan} now names it, with the output folder {output}")
    for config in configs:
        print(f"  {config}: [collaborator] federation = {args.federation!r}")
    print(f"wrote {args.out}: the same roster, the plan pinned under the new id")
    print(f"manifest sha256 {digest}")
    print(
        f"next: every institution compares the digest out of band, puts {args.out} in place of {args.manifest} and "
        f"sets [collaborator] federation = {args.federation!r} in its collaborator.toml (done above for the "
        "configs given with --config); then start the aggregator and the collaborators as before: their bindings "
        "and privacy ledgers start afresh under the new id"
    )
    return 0


def _diff_command(args: argparse.Namespace) -> int:
    from fedfair.runtime.manifest import setting_differences

    changes = setting_differences(settings_of(args.old), settings_of(args.new))
    for line in changes:
        print(line)
    if not changes:
        print("the same plan")
    return 1 if changes else 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair plan pin`, `fedfair plan renew` and `fedfair plan diff`."""
    group = subparsers.add_parser("plan", help="pin the agreed plan in the manifest; compare two plans")
    commands = group.add_subparsers(dest="plan_command", required=True, metavar="COMMAND")
    pin = commands.add_parser("pin", help="write a new manifest that pins a plan (the operator's edit of a plan)")
    pin.add_argument("--plan", type=Path, required=True, help="the aggregator's plan.toml to pin")
    pin.add_argument("--manifest", type=Path, required=True, help="the manifest in force (or the fresh roster)")
    pin.add_argument("--out", type=Path, required=True, help="the new manifest to write (never over a file)")
    pin.set_defaults(handler=_pin_command)
    renew = commands.add_parser(
        "renew",
        help="start a new federation from the same sites and certificates: a new id, a fresh output folder "
        "and a new manifest (to run a finished federation again)",
    )
    renew.add_argument("--plan", type=Path, required=True, help="the aggregator's plan.toml (rewritten in place)")
    renew.add_argument("--manifest", type=Path, required=True, help="the manifest in force")
    renew.add_argument("--federation", required=True, metavar="ID", help="the new federation's id")
    renew.add_argument("--out", type=Path, required=True, help="the new manifest to write (never over a file)")
    renew.add_argument(
        "--config",
        type=Path,
        action="append",
        metavar="COLLABORATOR_TOML",
        help="a collaborator.toml on this machine to give the new id too (repeatable; each institution "
        "otherwise sets it in its own)",
    )
    renew.set_defaults(handler=_renew_command)
    diff = commands.add_parser(
        "diff", help="the fields two plans differ in (each a manifest's pinned plan or a plan.toml); exit 1 if any"
    )
    diff.add_argument("old", type=Path)
    diff.add_argument("new", type=Path)
    diff.set_defaults(handler=_diff_command)
