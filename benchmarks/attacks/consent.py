"""Consent and pins: what an aggregator may make a collaborator run, and what it may make it sum.

The aggregator is fedfair's own in a thread (:class:`~attacks.pinned_federation.LoopAggregator`,
its round loop adjustable too), its plan edited and loaded without holding it to
the manifest it names, or its relay and round loop patched; the collaborators are real
:class:`~fedfair.runtime.collaborator.client.Collaborator` objects in threads. Each row is
decided by what happened (marker files a factory leaves, the round log, the collaborators'
failures and warnings, the uploads the aggregator received, the sums it decoded) and has
a control run where the honest path works.

- factory: the plan names a model factory ("package.module:function", code). The
  aggregator's own plan names it, so the aggregator builds it (its marker appears: the
  code is live); a collaborator whose manifest pins the plan, and one whose manifest is
  a roster only (no ``[plan]``) and whose config does not list the factory, must both
  refuse before importing it. The control is a collaborator that lists the factory in
  its ``[model] factories``: it builds it.
- unpinned plan: the plan differs from the pinned one in the evaluation's grid
  (``loss_range = [20, 80]``, the review's evaluation query) and the masking graph
  (``neighbours``); the collaborator refuses and its message names both fields.
- bundle: a model bundle whose architecture names a factory (a marker-writing one, and
  ``os:system`` with a shell command): ``fedfair predict`` refuses it (exit 2) without
  ``--allow-factory NAME``, even with another factory allowed; a built-in bundle predicts
  and the factory bundle builds once its factory is allowed (the controls).
- survivor floor: a roster of 4 with ``min_round_size = 4``; the aggregator discards one
  site's masked input, so the survivor set (3) is at the threshold t = 3 but below the
  floor: no collaborator may sign it. The control discards nothing.
- differencing (:mod:`attacks.differencing`), statistics (:mod:`attacks.statistics_sum`) and the evaluation
  query (:mod:`attacks.evaluation_query`): rows of this scenario in modules of their own, over the same
  pinned federation (:mod:`attacks.pinned_federation`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from torch import nn

from attacks.cheating import collaborator_log
from attacks.federation import HonestCollaborators
from attacks.pinned_federation import (
    FOUR,
    FEDERATION_ID,
    RUN_SECONDS,
    AGGREGATOR_THREAD,
    LoopAggregator,
    StageTap,
    lines_of,
    wait_until,
    fixed,
    pinned_workspace,
    round_log,
    served_differences,
    short,
)
from attacks.differencing import differencing_row
from attacks.statistics_sum import institution_table, statistics_row
from attacks.evaluation_query import evaluation_query_row
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.bundle import Bundle, builtin_architecture, factory_architecture, make_provenance, write_bundle
from fedfair.cli import main as fedfair_main
from fedfair.core.models import build_model
from fedfair.datasets.schema import draft_schema
from fedfair.datasets.statistics import encoder_from_statistics, statistics_vector
from fedfair.pki.roster import Roster, pins_from_folders, write_manifest
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.manifest import load_manifest
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.plan.model import ADULT_FEATURES

FACTORY = "attacks.consent:marked_model"
PLAN_OPERATOR = "cheating aggregator (fedfair's aggregator serving a plan edited past its manifest)"
BUNDLE_USER = "fedfair predict (fedfair.cli.main) on a hand-made bundle"


# ---------------------------------------------------------------- the factory an attacker names


def marked_model(folder: str, features: int = ADULT_FEATURES, classes: int = 2) -> nn.Module:
    """A model factory with a side effect: it leaves a marker in `folder` named after the process and
    thread that called it (the aggregator's thread, ``honest-NAME`` for a collaborator's, ``MainThread``
    for ``fedfair predict`` here), then returns a logistic regression. Any code could stand here."""
    where = Path(folder)
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{os.getpid()}-{threading.current_thread().name}").write_text("the factory ran here\n")
    return build_model("logreg", features, classes)


def marked_by(folder: Path) -> list[str]:
    """The threads that called :func:`marked_model` with `folder` (its markers), sorted."""
    if not folder.is_dir():
        return []
    return sorted(path.name.split("-", 1)[1] for path in folder.iterdir())


# ---------------------------------------------------------------- survivor floor (and the pinned control)


@dataclass
class FloorRun:
    """One round of the pinned four-site federation, the masked inputs of `discard` dropped by the aggregator."""

    log: dict[int, dict[str, Any]]
    tap: StageTap
    said: list[str]
    contributed: dict[str, list[int]]
    errors: dict[str, str]


def floor_run(root: Path, discard: frozenset[str]) -> FloorRun:
    workspace = pinned_workspace(root, quorum=4)
    plan = load_aggregator_plan(workspace.plan)
    tap = StageTap(discard)
    aggregator = LoopAggregator(plan, tap.install)
    with collaborator_log() as said:
        group = HonestCollaborators.start(workspace, FOUR, fixed)
        try:
            group.join(RUN_SECONDS)
        finally:
            group.stop()
            aggregator.stop()
    errors = {**group.errors, **({"aggregator": aggregator.error} if aggregator.error else {})}
    contributed = {name: list(collaborator.contributed_rounds) for name, collaborator in group.collaborators.items()}
    return FloorRun(round_log(workspace), tap, said, contributed, errors)


def control_summary(control: FloorRun) -> tuple[bool, str]:
    """Whether the pinned control applied round 1 with all four sites, and how it went."""
    record = control.log.get(1, {})
    ok = record.get("status") == "applied" and sorted(record.get("contributors", [])) == list(FOUR)
    return ok, f"round 1 {record.get('status', 'not run')} with {record.get('contributors', [])}" + (
        "" if ok else f" (errors: {control.errors})"
    )


def survivor_floor_row(root: Path, book: RowBook, control: FloorRun) -> None:
    dropped = FOUR[-1]
    with book.row(
        "survivor floor: the aggregator claims a site dropped at MASKED_INPUT, leaving 3 survivors of 4 "
        "(at the threshold t = 3, below the manifest's min_round_size = 4)",
        "no honest collaborator signs the survivor set (each says it has fewer survivors than the floor); no "
        "unmasking, the round is not applied; with nothing discarded the same federation applies the round "
        "(the control)",
        PATCHED_AGGREGATOR,
    ) as row:
        attack = floor_run(root, frozenset({dropped}))
        control_ok, control_text = control_summary(control)
        record = attack.log.get(1, {})
        shown = attack.tap.expected.get((1, "STAGE_CONSISTENCY"))
        signed = attack.tap.sent(1, "STAGE_CONSISTENCY")
        unmasked = attack.tap.sent(1, "STAGE_UNMASK")
        refusals = {name: lines_of(attack.said, name, "survivors, fewer than") for name in FOUR[:3]}
        refused = sorted(name for name, lines in refusals.items() if lines)
        carried_out = bool(attack.tap.discarded) and shown == sorted(FOUR[:3])
        said = next((lines[0] for lines in refusals.values() if lines), None)
        row.record(
            f"discarded: {attack.tap.discarded or 'nothing (the masked stage never opened)'}; survivor set shown at "
            f"CONSISTENCY: {shown}; signatures sent: {signed or 'none'}; unmasking responses: {unmasked or 'none'}; "
            f"refused: {refused}, e.g. {short(said, 300)!r}; round 1: {record.get('status', 'not run')}; "
            f"control: {control_text}",
            carried_out
            and control_ok
            and not signed
            and not unmasked
            and refused == sorted(FOUR[:3])
            and record.get("status") != "applied",
            reason=record.get("reason"),
            errors=attack.errors,
        )


# ---------------------------------------------------------------- factory and unpinned plan


@dataclass
class FactoryRun:
    """What became of a plan naming FACTORY: each collaborator's failure, and who ran the factory."""

    errors: dict[str, str]
    contributed: dict[str, list[int]]
    ran: list[str]
    aggregator_error: str | None


def factory_run(root: Path, pinned: str, unpinned: str, consenting: str) -> FactoryRun:
    """One federation: the aggregator's plan names FACTORY; `pinned` holds the pinned manifest, `unpinned` a
    roster-only manifest, `consenting` a roster-only manifest and FACTORY in its [model] factories."""
    workspace = pinned_workspace(root, quorum=4)
    markers = root / "markers"
    roster_only = root / "roster-only-manifest.toml"
    write_manifest(roster_only, Roster(FEDERATION_ID, tuple(pins_from_folders([workspace.certs])), 0, 4))
    plan = load_aggregator_plan(
        workspace.plan,
        {"model": {"factory": FACTORY, "arguments": {"folder": str(markers)}}},
        check_manifest=False,
    )
    roster = load_manifest(roster_only)
    configs = {name: load_collaborator_config(workspace.configs[name]) for name in (pinned, unpinned, consenting)}
    configs[unpinned] = dataclasses.replace(configs[unpinned], manifest=roster)
    configs[consenting] = dataclasses.replace(configs[consenting], manifest=roster, factories=(FACTORY,))
    aggregator = LoopAggregator(plan)
    group = HonestCollaborators.launch(configs, fixed)
    try:
        for name in (pinned, unpinned):
            group.threads[name].join(RUN_SECONDS)
        wait_until(lambda: f"honest-{consenting}" in marked_by(markers), 30)
    finally:
        group.stop()
        aggregator.stop()
    contributed = {name: list(collaborator.contributed_rounds) for name, collaborator in group.collaborators.items()}
    return FactoryRun(dict(group.errors), contributed, marked_by(markers), aggregator.error)


def factory_rows(root: Path, book: RowBook, control: FloorRun) -> None:
    """The pinned and the roster-only collaborator, in one federation beside a consenting one (the control)."""
    pinned, unpinned, consenting = FOUR[:3]
    expected_common = (
        "before importing it; the factory never runs at the collaborator, while the aggregator (whose own plan "
        "names it) and a collaborator that lists it in [model] factories both run it (the controls)"
    )
    cases = (
        (
            pinned,
            "the collaborator's manifest pins the plan",
            "refused as plan-mismatch: not the pinned plan, naming model.factory, ",
            ("not the plan pinned", "model.factory"),
        ),
        (
            unpinned,
            "the collaborator's manifest is a roster only (no [plan]) and its config lists no factory",
            "refused as plan-mismatch: the factory is not one this institution allows, ",
            ("does not allow", "was not imported"),
        ),
    )
    outcome: FactoryRun | None = None
    for name, holding, expected, words in cases:
        with book.row(
            f"factory: the aggregator's plan names a model factory (code leaving a marker); {holding}",
            expected + expected_common,
            PLAN_OPERATOR,
        ) as row:
            if outcome is None:
                outcome = factory_run(root, pinned, unpinned, consenting)
            ran = outcome.ran
            live = AGGREGATOR_THREAD in ran and f"honest-{consenting}" in ran
            error = outcome.errors.get(name, "")
            refused = "plan-mismatch" in error and FACTORY in error and all(word in error for word in words)
            control_ok, control_text = control_summary(control)
            shown = served_differences(error) or short(error)
            row.record(
                f"{name}: {shown if error else 'no refusal (still running or finished)'}; the factory ran in: "
                f"{ran or 'no thread'}; {name} contributed to rounds {outcome.contributed.get(name) or 'none'}; "
                f"pinned control with the genuine plan: {control_text}",
                refused and live and f"honest-{name}" not in ran and control_ok,
                refusal=short(error, 1000),
                consenting_site=consenting,
                aggregator_error=short(outcome.aggregator_error, 200),
            )


def unpinned_plan_row(root: Path, book: RowBook, control: FloorRun) -> None:
    with book.row(
        "unpinned plan: the aggregator serves a plan unlike the pinned one: the evaluation grid's loss_range "
        "[20, 80] (the review's evaluation query) and secure_aggregation neighbours = 2",
        "every collaborator holding the pinned manifest refuses the plan (plan-mismatch) before any round, its "
        "message naming evaluation.loss_range and secure_aggregation.neighbours; with the genuine plan the same "
        "collaborators contribute (the control)",
        PLAN_OPERATOR,
    ) as row:
        workspace = pinned_workspace(root, quorum=4)
        plan = load_aggregator_plan(
            workspace.plan,
            {"evaluation": {"loss_range": [20.0, 80.0]}, "secure_aggregation": {"neighbours": 2}},
            check_manifest=False,
        )
        aggregator = LoopAggregator(plan)
        group = HonestCollaborators.start(workspace, FOUR, fixed)
        try:
            group.join(RUN_SECONDS)
        finally:
            group.stop()
            aggregator.stop()
        fields = ("not the plan pinned", "evaluation.loss_range", "secure_aggregation.neighbours")
        refused = sorted(
            name
            for name in FOUR
            if "plan-mismatch" in group.errors.get(name, "") and all(word in group.errors[name] for word in fields)
        )
        contributed = {name: c.contributed_rounds for name, c in group.collaborators.items() if c.contributed_rounds}
        control_ok, control_text = control_summary(control)
        example = group.errors.get(FOUR[0], "")
        row.record(
            f"refused (plan-mismatch): {refused}, {FOUR[0]} saying {served_differences(example) or short(example)!r}; "
            f"contributed: {contributed or 'nobody'}; control with the genuine plan: {control_text}",
            refused == list(FOUR) and not contributed and control_ok,
            refusal=short(example, 1000),
            aggregator_error=short(aggregator.error, 200),
        )


# ---------------------------------------------------------------- bundle


def predict(bundle: Path, data: Path, out: Path, *allowed: str) -> tuple[int, str]:
    """`fedfair predict` in this process: its exit status and what it wrote to stderr."""
    errors = io.StringIO()
    command = ["predict", "--model", str(bundle), "--data", str(data), "--out", str(out)]
    for name in allowed:
        command += ["--allow-factory", name]
    with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
        code = fedfair_main(command)
    return code, errors.getvalue().strip()


def bundle_row(root: Path, book: RowBook) -> None:
    with book.row(
        "bundle: a model bundle whose architecture names a factory (a marker-writing function; os:system with "
        "a shell command), given to fedfair predict",
        "predict refuses (exit 2) without --allow-factory naming that very factory, even with another factory "
        "allowed, and nothing runs (no marker); a built-in bundle predicts, and the factory bundle builds once "
        "its factory is allowed (the controls)",
        BUNDLE_USER,
    ) as row:
        root.mkdir(parents=True, exist_ok=True)
        table = institution_table(120)
        schema = draft_schema(table, "income")
        encoder = encoder_from_statistics(schema, statistics_vector(schema, table))
        features = encoder.num_features
        genuine = Bundle(
            state_dict=build_model("logreg", features, 2).state_dict(),
            architecture=builtin_architecture("logreg", features, 2),
            encoder=encoder.to_mapping(),
            threshold=0.5,
            plan={"objective": {"rho": 0.3, "epsilon": 0.1}},
            metrics=[],
            provenance=make_provenance(1, {"site-a": 1}),
        )
        data = root / "rows.csv"
        table.drop(columns="income").to_csv(data, index=False)
        markers, shell_marker = root / "markers", root / "os-system-ran"
        paths = {"built-in": root / "genuine.bundle", FACTORY: root / "factory.bundle", "os:system": root / "os.bundle"}
        write_bundle(paths["built-in"], genuine)
        write_bundle(
            paths[FACTORY],
            dataclasses.replace(
                genuine, architecture=factory_architecture(FACTORY, {"folder": str(markers), "features": features})
            ),
        )
        write_bundle(
            paths["os:system"],
            dataclasses.replace(
                genuine, architecture=factory_architecture("os:system", {"command": f"touch '{shell_marker}'"})
            ),
        )
        outcomes: dict[str, tuple[int, str]] = {}
        for name in (FACTORY, "os:system"):
            outcomes[f"{name}, nothing allowed"] = predict(paths[name], data, root / "hostile.csv")
            outcomes[f"{name}, torch.nn:Identity allowed"] = predict(
                paths[name], data, root / "hostile.csv", "torch.nn:Identity"
            )
        ran_before = marked_by(markers) + ([shell_marker.name] if shell_marker.exists() else [])
        refused = {
            attempt: code == 2 and "it was not imported" in message for attempt, (code, message) in outcomes.items()
        }
        control_code, control_message = predict(paths["built-in"], data, root / "genuine.csv")
        predicted = len(pd.read_csv(root / "genuine.csv")) if control_code == 0 else 0
        allowed_code, allowed_message = predict(paths[FACTORY], data, root / "allowed.csv", FACTORY)
        live = allowed_code == 0 and marked_by(markers) == ["MainThread"]
        example = outcomes[f"{FACTORY}, nothing allowed"][1]
        row.record(
            f"exit statuses: { {attempt: code for attempt, (code, _) in outcomes.items()} }; refused with the fix: "
            f"{sorted(attempt for attempt, ok in refused.items() if ok)}; markers before consent: "
            f"{ran_before or 'none'}; e.g. {short(example, 300)!r}; control: the built-in bundle predicted {predicted} "
            f"rows (exit {control_code}); with --allow-factory {FACTORY}: exit {allowed_code}, the factory ran "
            f"({marked_by(markers) or 'no marker'})",
            all(refused.values()) and not ran_before and predicted == len(table) and live,
            control_error=control_message or None,
            allowed_error=allowed_message or None,
        )


# ---------------------------------------------------------------- the scenario


def consent_rows(root: Path, book: RowBook) -> None:
    """Every row of the scenario; the pinned control federation first (the factory, unpinned-plan and
    survivor-floor rows compare with it)."""
    control = floor_run(root / "pinned-control", frozenset())
    factory_rows(root / "factory", book, control)
    unpinned_plan_row(root / "unpinned-plan", book, control)
    bundle_row(root / "bundle", book)
    differencing_row(root / "differencing", book)
    survivor_floor_row(root / "survivor-floor", book, control)
    statistics_row(root / "statistics", book)
    evaluation_query_row(root / "evaluation-query", book)
