"""``fedfair plan pin | renew | diff | show``: pin the agreed plan, start a new federation, compare, inspect plans.

The operator's workflow is in :mod:`fedfair.runtime.plan.pinning`; these are its command lines.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _pin_command(args: argparse.Namespace) -> int:
    from fedfair.runtime.plan.pinning import pin_plan

    configs = list(args.config or [])
    digest, changes = pin_plan(args.plan, args.manifest, args.out, configs=configs)
    print(f"wrote {args.out}: {args.manifest} with the plan {args.plan} pinned")
    for config in configs:
        print(f"  {config}: names it as its manifest")
    if changes is None:
        print("the plan is pinned for the first time")
    elif not changes:
        print("the plan is the one already pinned: nothing changed")
    else:
        print("changed since the old pin (old -> new):")
        for line in changes:
            print(f"  {line}")
    print(f"manifest sha256 {digest}")
    if changes is None:
        done = " (done above for the files given with --config)" if configs else ""
        print(
            f"next: send {args.out} to every institution; each reads its [plan] settings, compares the digest "
            'out of band, keeps a copy and sets manifest = "PATH" in its collaborator.toml (the aggregator in '
            f"its plan.toml){done}"
        )
    else:
        print(
            "next: every institution reviews `fedfair plan diff OLD NEW`, compares the digest out of band and keeps "
            "a copy"
        )
    return 0


def _renew_command(args: argparse.Namespace) -> int:
    from fedfair.runtime.plan.pinning import renew_federation

    configs = list(args.config or [])
    digest, output, changes = renew_federation(args.plan, args.manifest, args.federation, args.out, configs)
    print(f"federation {args.federation}: {args.plan} now names it, with the output folder {output}")
    for config in configs:
        print(f"  {config}: [collaborator] federation = {args.federation!r}")
    print(f"wrote {args.out}: the same roster, the plan pinned under the new id")
    if changes:
        print(f"the plan also changed since {args.manifest} pinned it (old -> new), and the new manifest carries it:")
        for line in changes:
            print(f"  {line}")
        print(f"  every institution reviews them: fedfair plan diff {args.manifest} {args.out}")
    print(f"manifest sha256 {digest}")
    print(
        f"next: every institution compares the digest out of band, puts {args.out} in place of {args.manifest} and "
        f"sets [collaborator] federation = {args.federation!r} in its collaborator.toml (done above for the "
        "configs given with --config); then start the aggregator and the collaborators as before: their records of "
        "inputs start afresh under the new id, and each site's privacy ledger for its data continues from what "
        "it has spent"
    )
    return 0


def _diff_command(args: argparse.Namespace) -> int:
    from fedfair.runtime.manifest_plan import setting_differences
    from fedfair.runtime.plan.pinning import settings_of

    changes = setting_differences(settings_of(args.old), settings_of(args.new))
    for line in changes:
        print(line)
    if not changes:
        print("the same plan")
    return 1 if changes else 0


def _show_command(args: argparse.Namespace) -> int:
    from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, model_parameters
    from fedfair.runtime.plan.bounded_check import bounded_soundness_line
    from fedfair.runtime.plan.kind_checks import check_plan_at_size
    from fedfair.runtime.plan.input_bound import bounded_check_lines, input_bound_line
    from fedfair.runtime.plan.sum_check import round_config, sum_check_lines

    plan = load_aggregator_plan(args.plan, check_manifest=False)
    print(f"{args.plan}: federation {plan.federation_id}, {len(plan.collaborators)} collaborators")
    if not plan.secure_aggregation.enabled:
        print("training sums: none (secure aggregation is off: the aggregator sees every update)")
        return 0
    parameters = model_parameters(plan)
    config = round_config(plan, parameters)
    bounded = plan.secure_aggregation.bounds_inputs
    check_plan_at_size(plan, len(plan.collaborators), str(args.plan), parameters)  # the model's size, now known
    for line in bounded_check_lines(plan.privacy.distributed) if bounded else sum_check_lines(config):
        print(line)
    print(input_bound_line(plan.secure_aggregation))
    if bounded:
        print(bounded_soundness_line(plan, len(plan.collaborators), parameters))
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair plan pin`, `fedfair plan renew`, `fedfair plan diff` and `fedfair plan show`."""
    group = subparsers.add_parser("plan", help="pin the agreed plan in the manifest; compare two plans")
    commands = group.add_subparsers(dest="plan_command", required=True, metavar="COMMAND")
    pin = commands.add_parser("pin", help="write a new manifest that pins a plan (the operator's edit of a plan)")
    pin.add_argument("--plan", type=Path, required=True, help="the aggregator's plan.toml to pin")
    pin.add_argument("--manifest", type=Path, required=True, help="the manifest in force (or the fresh roster)")
    pin.add_argument("--out", type=Path, required=True, help="the new manifest to write (never over a file)")
    pin.add_argument(
        "--config",
        type=Path,
        action="append",
        metavar="TOML",
        help="a collaborator.toml, the plan.toml or an auditor.toml on this machine to name the new manifest in "
        '(repeatable; writes manifest = "PATH", relative to its folder)',
    )
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
    show = commands.add_parser(
        "show",
        help="which check the plan's secure sums get (re-summed by every site, or re-checked by max_colluding + 1 sites "
        "each above the re-sum bound; under the input bound "
        "the bounded sum's) for its model size and roster, and the input bound in force",
    )
    show.add_argument("--plan", type=Path, required=True, help="the aggregator's plan.toml")
    show.set_defaults(handler=_show_command)
