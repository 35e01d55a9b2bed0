"""``fedfair plan pin | diff``: pin the agreed plan in the federation manifest, and see what a new one changes.

Every collaborator refuses a plan other than the one its manifest pins
(:func:`fedfair.runtime.manifest.check_shared_settings`), so changing the plan is a new
manifest that every institution accepts. The operator's everyday edit is therefore:

1. edit ``aggregator/plan.toml``;
2. ``fedfair plan pin --plan aggregator/plan.toml --manifest manifest.toml --out manifest-2.toml``
   (prints the fields that changed and the new manifest's digest);
3. every institution reviews ``fedfair plan diff manifest.toml manifest-2.toml``, compares the
   digest out of band and replaces its copy; the aggregator's plan names the new file.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.pki.roster import PARTICIPANTS, PlanPin, write_manifest
from fedfair.runtime.toml_tables import read_toml

# The plan and manifest modules read schemas (pandas): imported where a command runs, so that
# `fedfair plan --help` answers at once.


def pin_plan(plan_path: Path, manifest_path: Path, out: Path) -> tuple[str, list[str] | None]:
    """Write to ``out`` the manifest at ``manifest_path`` with the plan at ``plan_path`` pinned.

    The plan is read without holding it to the manifest it names (it is the edit being
    pinned) and then checked against the new manifest like any plan. Returns the new
    manifest's digest and the fields that changed since the old pin (None: it pinned none).
    """
    from fedfair.runtime.manifest import load_manifest, manifest_digest, setting_differences
    from fedfair.runtime.plan import check_plan, load_aggregator_plan, shared_content

    plan = load_aggregator_plan(plan_path, check_manifest=False)
    roster = load_manifest(manifest_path)
    content = shared_content(plan)
    pinned = dataclasses.replace(roster, plan=PlanPin(content), source=out)
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


def _diff_command(args: argparse.Namespace) -> int:
    from fedfair.runtime.manifest import setting_differences

    changes = setting_differences(settings_of(args.old), settings_of(args.new))
    for line in changes:
        print(line)
    if not changes:
        print("the same plan")
    return 1 if changes else 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair plan pin` and `fedfair plan diff`."""
    group = subparsers.add_parser("plan", help="pin the agreed plan in the manifest; compare two plans")
    commands = group.add_subparsers(dest="plan_command", required=True, metavar="COMMAND")
    pin = commands.add_parser("pin", help="write a new manifest that pins a plan (the operator's edit of a plan)")
    pin.add_argument("--plan", type=Path, required=True, help="the aggregator's plan.toml to pin")
    pin.add_argument("--manifest", type=Path, required=True, help="the manifest in force (or the fresh roster)")
    pin.add_argument("--out", type=Path, required=True, help="the new manifest to write (never over a file)")
    pin.set_defaults(handler=_pin_command)
    diff = commands.add_parser(
        "diff", help="the fields two plans differ in (each a manifest's pinned plan or a plan.toml); exit 1 if any"
    )
    diff.add_argument("old", type=Path)
    diff.add_argument("new", type=Path)
    diff.set_defaults(handler=_diff_command)
