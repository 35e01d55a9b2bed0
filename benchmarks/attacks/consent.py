"""Consent and pins: what an aggregator may make a collaborator run, and what it may make it sum.

The aggregator is fedfair's own in a thread (:class:`~attacks.cheating.PatchedAggregator`,
here with its round loop adjustable too), its plan edited and loaded without holding it to
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
- differencing: round 1 with every site, then round 2 on the same model (the loop does
  not advance it) without one site, the collaborators restarted in between, with
  ``batch_fraction = 1`` so each update is a function of the model: the difference of
  the two sums would be the missing site's update. The collaborators must sign no second
  survivor set for that input. The control re-runs the model with every site.
- survivor floor: a roster of 4 with ``min_round_size = 4``; the aggregator discards one
  site's masked input, so the survivor set (3) is at the threshold t = 3 but below the
  floor: no collaborator may sign it. The control discards nothing.
- statistics: a ``[schema]`` federation of four CSV tables, one holding a country (a learnt
  column, read through the public bucket hash and a dictionary) and another a listed sector
  in exactly 1 row. The decoded statistics sum (round 0) must hold no categorical count from
  1 to ``min_category_count`` - 1, the rare cells 0; the control counts the same tables
  without suppression (pandas) and finds both at 1. Then, the collaborators restarted, the
  aggregator re-runs round 0 (its stage gate rewound, as a fresh process's would be) with
  every site (the control: the same sum) and without one site: nobody may sign that.
- evaluation query: the review's crafted logistic model (10 on age, bias 40), evaluated
  under a served plan with ``loss_range = [20, 80]`` (refused: plan-mismatch), and under
  the pinned plan twice, the second time without one site. Under secure aggregation no site
  evaluates a model its chain did not make (issue 79): every site sits both out, nothing is
  decoded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from attacks.cheating import PatchedAggregator, collaborator_log
from attacks.federation import FixedTrainer, HonestCollaborators, kept_state, plan_sections, trainer_factory
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.bundle import Bundle, builtin_architecture, factory_architecture, make_provenance, write_bundle
from fedfair.cli import main as fedfair_main
from fedfair.core import server
from fedfair.core.models import build_model
from fedfair.datasets.schema import Column, Schema, draft_schema
from fedfair.datasets.statistics import encoder_from_statistics, statistics_slices, statistics_vector
from fedfair.datasets.values import category_bucket
from fedfair.fairness import sums
from fedfair.pki.roster import Roster, pins_from_folders, write_manifest
from fedfair.runtime.aggregator.stages import UploadHandler
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.core.errors import StatisticsError
from fedfair.runtime.aggregator.network import Network, serve
from fedfair.runtime.aggregator.start import GOODBYE_SECONDS, prepare
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.trainer import LocalTable, TrainerFactory, check_schema_table
from fedfair.runtime.contract import EVALUATION, TRAINING, model_digest, model_download
from fedfair.runtime.local.workspace import Workspace, make_workspace, write_pinned_manifest
from fedfair.runtime.manifest import load_manifest
from fedfair.runtime.plan.aggregator_plan import (
    AggregatorPlan,
    load_aggregator_plan,
    load_shared_settings,
    plan_digest,
    shared_settings,
)
from fedfair.runtime.preprocessing import STATISTICS_KIND, STATISTICS_ROUND
from fedfair.runtime.plan.model import ADULT_FEATURES
from fedfair.runtime.transport import StageGate
from fedfair.runtime.transport import fedfair_pb2 as pb

FOUR = ("site-a", "site-b", "site-c", "site-d")
FEDERATION_ID = "fedfair-launch"  # what make_workspace writes
TIMEOUT = 15.0
RUN_SECONDS = 60.0
FACTORY = "attacks.consent:marked_model"
AGGREGATOR_THREAD = "consent-aggregator"
"""The aggregator's thread (LoopAggregator names it so): where its own plan's model is built."""
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


# ---------------------------------------------------------------- the aggregator and its taps


class LoopAggregator(PatchedAggregator):
    """A PatchedAggregator whose round loop is adjusted too (`adjust(loop)` before the first round).

    The evaluation after the last round is skipped: no row here needs it, and it costs a secure sum.
    """

    def __init__(
        self,
        plan: AggregatorPlan,
        patch: Callable[[Network], None] | None = None,
        adjust: Callable[[RoundLoop], None] | None = None,
    ) -> None:
        self.adjust = adjust or (lambda loop: None)
        super().__init__(plan, patch or (lambda network: None))

    def _run(self) -> None:
        threading.current_thread().name = AGGREGATOR_THREAD
        try:
            checkpoint = prepare(self.plan, resume=False)
            network = serve(self.plan, plan_digest(self.plan))
            self.network = network
            self.patch(network)
            loop = RoundLoop(self.plan, network, checkpoint)
            loop.evaluation_due = lambda round_number: False  # type: ignore[method-assign]
            self.adjust(loop)
            self.listening.set()
            try:
                loop.run()
                network.board.wait_until_alone(GOODBYE_SECONDS)
            finally:
                network.stop()
        except Exception as error:  # noqa: BLE001 -- reported in the row
            self.error = f"{type(error).__name__}: {error}"
        finally:
            self.listening.set()


@dataclass
class StageTap:
    """The aggregator's relay, watched: every stage it opens (with whom it expects), every upload it
    receives (recorded before any check), and the masked inputs of `discard`, dropped unseen so that the
    secure-aggregation server counts their senders as dropped out (the aggregator's claim)."""

    discard: frozenset[str] = frozenset()
    expected: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    uploads: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    discarded: list[str] = field(default_factory=list)

    def install(self, network: Network) -> None:
        board = network.board
        open_stage = board.open_stage

        def tapped(
            binding: pb.Binding,
            expected: Any,
            inputs: bytes | Mapping[str, bytes],
            handler: UploadHandler,
            **options: Any,
        ) -> None:
            key = (binding.round, pb.Stage.Name(binding.stage))
            self.expected[key] = sorted(expected)
            masked = binding.stage == pb.STAGE_MASKED_INPUT

            def absorb(peer: str, payload: bytes) -> None:
                self.uploads.setdefault(key, []).append(peer)
                if masked and peer in self.discard:
                    self.discarded.append(f"round {binding.round}: {peer}")
                    return
                handler(peer, payload)

            open_stage(binding, expected, inputs, absorb, **options)

        board.open_stage = tapped  # type: ignore[method-assign]

    def sent(self, round_number: int, stage: str) -> list[str]:
        return sorted(set(self.uploads.get((round_number, stage), [])))


def restart_collaborators(
    workspace: Workspace,
    board: Any,
    groups: list[HonestCollaborators],
    trainers: Callable[[str], TrainerFactory | None],
) -> tuple[bool, list[str]]:
    """Stop the running collaborators (`groups[-1]`), wait until they have ended and the aggregator sees
    them gone, start them again with `trainers` (appended to `groups`): whether all four reconnected (False
    if an old one never ended), and who kept a bindings file."""
    groups[-1].stop()
    # Every old collaborator must be gone before the new ones start: one still running (slow to stop
    # on a loaded machine) would reconnect under the same name and take part in the new session.
    if groups[-1].join(RUN_SECONDS):
        return False, []
    kept = sorted(
        name for name in FOUR if (workspace.configs[name].parent / f"{name}.{FEDERATION_ID}.bindings.json").exists()
    )
    wait_until(lambda: not board.connected() & set(FOUR), RUN_SECONDS)
    groups.append(HonestCollaborators.start(workspace, FOUR, trainers))
    return wait_until(lambda: board.connected() >= set(FOUR), 30), kept


def run_errors(groups: list[HonestCollaborators], aggregator: Any) -> dict[str, str]:
    """Every collaborator's error, by run, and the aggregator's."""
    errors = {
        f"{name} (run {index + 1})": error for index, group in enumerate(groups) for name, error in group.errors.items()
    }
    if aggregator.error:
        errors["aggregator"] = aggregator.error
    return errors


def lines_of(said: list[str], name: str, *words: str) -> list[str]:
    """`name`'s lines containing every one of `words`."""
    return [line for line in said if line.startswith(f"{name}:") and all(word in line for word in words)]


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def fixed(name: str) -> TrainerFactory:
    return trainer_factory(name, FixedTrainer)


def pinned_workspace(root: Path, *, quorum: int, rounds: int = 1, **extra: Mapping[str, Any]) -> Workspace:
    """Four sites, secure aggregation, and a manifest pinning every certificate and the plan
    (min_round_size = the quorum), named by the plan and every config: careful institutions."""
    sections = plan_sections(secure=True, rounds=rounds, quorum=quorum, timeout=TIMEOUT, **extra)
    return make_workspace(root, FOUR, plan=sections, manifest=True)


def round_log(workspace: Workspace) -> dict[int, dict[str, Any]]:
    return {int(record["round"]): record for record in read_round_log(workspace.output)}


def served_differences(error: str) -> str | None:
    """The "pinned -> served" field list of a plan-mismatch refusal against a pinned plan, or None."""
    start = error.find("pinned -> served: ")
    if start < 0:
        return None
    end = error.find("); a plan changes", start)
    return error[start : end if end > 0 else None]


def short(text: str | None, limit: int = 400) -> str:
    text = text or "nothing"
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


def institution_table(rows: int, seed: int = 0) -> pd.DataFrame:
    generator = np.random.default_rng(seed)
    age = generator.integers(18, 90, rows)
    hours = generator.normal(40, 12, rows).round(1)
    sector = generator.choice(["private", "public", "self-employed"], rows)
    score = (age - 50) / 15 + (hours - 40) / 12 + (sector == "public") + generator.normal(0, 0.5, rows)
    label = np.where(score > 0, ">50K", "<=50K")
    return pd.DataFrame({"age": age, "hours": hours, "sector": sector, "income": label})


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


# ---------------------------------------------------------------- differencing


@dataclass
class Differencing:
    """Round 1 with every site; round 2 on the same model (the loop does not advance it), without
    `leave_out` (None: the control, every site again). The round-2 participants are chosen only once
    the harness has restarted the collaborators (`first_done`, then `proceed`); every training sum the
    aggregator decodes is kept."""

    leave_out: str | None
    first_done: threading.Event = field(default_factory=threading.Event)
    proceed: threading.Event = field(default_factory=threading.Event)
    sums: dict[int, tuple[np.ndarray, float]] = field(default_factory=dict)
    """Per round: the decoded weighted sum and its error bound (the encoding's stochastic rounding)."""

    def adjust(self, loop: RoundLoop) -> None:
        train, participants, run = loop.train, loop.choose_participants, loop.driver.run

        def held_train(round_number: int, **options: Any) -> dict[str, Any]:
            if round_number == 2:
                self.first_done.set()
                self.proceed.wait(RUN_SECONDS)
            before = kept_state(loop.checkpoint.state)
            record = train(round_number, **options)
            if round_number == 1:
                loop.checkpoint = dataclasses.replace(loop.checkpoint, state=before)  # the model is not advanced
            return record

        def chosen(round_number: int, **options: Any) -> frozenset[str]:
            connected = participants(round_number, **options)
            if round_number == 2 and self.leave_out is not None:
                return connected - {self.leave_out}
            return connected

        def recording(round_number: int, stages: Any, *args: Any, **options: Any) -> SumOutcome:
            outcome = run(round_number, stages, *args, **options)
            if stages is TRAINING:
                self.sums[round_number] = (outcome.weighted_sum.copy(), outcome.error_bound)
            return outcome

        loop.train = held_train  # type: ignore[method-assign]
        loop.choose_participants = chosen  # type: ignore[method-assign]
        loop.driver.run = recording  # type: ignore[method-assign]


@dataclass
class DifferencingRun:
    log: dict[int, dict[str, Any]]
    cheat: Differencing
    tap: StageTap
    said: list[str]
    restarted: bool
    bindings_kept: list[str]
    contributed: dict[str, list[int]]
    """The rounds each restarted collaborator sent a masked input to (masked, so nothing without unmasking)."""
    errors: dict[str, str]


def differencing_run(root: Path, leave_out: str | None) -> DifferencingRun:
    # min_round_size = quorum = 3, so a round of three is legitimate: only the binding can refuse it.
    workspace = pinned_workspace(root, quorum=3, rounds=2, training={"batch_fraction": 1.0})
    plan = load_aggregator_plan(workspace.plan)
    cheat, tap = Differencing(leave_out), StageTap()
    aggregator = LoopAggregator(plan, tap.install, cheat.adjust)
    board = aggregator.network.board if aggregator.network is not None else None
    real: Callable[[str], TrainerFactory | None] = lambda name: None  # noqa: E731 -- each site's real learner
    restarted, kept = False, list[str]()
    with collaborator_log() as said:
        groups = [HonestCollaborators.start(workspace, FOUR, real)]
        try:
            if board is not None and cheat.first_done.wait(RUN_SECONDS):
                restarted, kept = restart_collaborators(workspace, board, groups, real)
            cheat.proceed.set()
            groups[-1].join(RUN_SECONDS)
        finally:
            for group in groups:
                group.stop()
            aggregator.stop()
    errors = run_errors(groups, aggregator)
    contributed = {
        name: list(collaborator.contributed_rounds) for name, collaborator in groups[-1].collaborators.items()
    }
    return DifferencingRun(
        round_log(workspace), cheat, tap, said, restarted and len(groups) == 2, kept, contributed, errors
    )


def differencing_row(root: Path, book: RowBook) -> None:
    left_out = FOUR[-1]
    with book.row(
        f"differencing: round 1 with every site, then round 2 on the same model without {left_out} "
        "(batch_fraction = 1, the collaborators restarted in between): the difference of the two sums would be "
        f"{left_out}'s update",
        "each honest collaborator, restarted, still finds that input bound to round 1's four survivors and signs "
        "no other set: round 2 is never unmasked, no second sum exists; the same re-run with every site is "
        "applied (the control)",
        PATCHED_AGGREGATOR,
    ) as row:
        control = differencing_run(root / "control", None)
        attack = differencing_run(root / "attack", left_out)
        first, second = attack.log.get(1, {}), attack.log.get(2, {})
        same_model = bool(first) and first.get("model_sha256") == second.get("model_sha256")
        participants = second.get("participants", [])
        carried_out = (
            attack.restarted
            and first.get("status") == "applied"
            and same_model
            and left_out not in participants
            and len(participants) >= 3
        )
        refusals = {
            name: lines_of(attack.said, name, "already signed for with other survivors") for name in participants
        }
        refused = sorted(name for name, lines in refusals.items() if lines)
        signed = attack.tap.sent(2, "STAGE_CONSISTENCY")
        unmasked = attack.tap.sent(2, "STAGE_UNMASK")
        control_second = control.log.get(2, {})
        control_ok = (
            control.restarted
            and control_second.get("status") == "applied"
            and control_second.get("model_sha256") == control.log.get(1, {}).get("model_sha256")
            and 2 in control.cheat.sums
        )
        # The premise: with batch_fraction = 1 an input is a function of the model, so the control's re-run
        # decodes round 1's sum again, but for the two roundings of the encoding (each within its bound).
        repeated: float | None = None
        if {1, 2} <= control.cheat.sums.keys():
            (one, bound_one), (two, bound_two) = control.cheat.sums[1], control.cheat.sums[2]
            repeated = float(np.abs(one - two).max())
            deterministic = repeated <= bound_one + bound_two
        else:
            deterministic = False
        said = next((lines[0] for lines in refusals.values() if lines), None)
        row.record(
            f"round 1: {first.get('status', 'not run')} with {first.get('contributors', [])}; collaborators restarted: "
            f"{attack.restarted} (bindings kept by {attack.bindings_kept}); round 2 on the same model: {same_model}, "
            f"participants {participants}; consistency signatures: {signed or 'none'}; unmasking responses: "
            f"{unmasked or 'none'}; refused: {refused}, e.g. {short(said, 300)!r}; round 2: "
            f"{second.get('status', 'not run')}; sums decoded in rounds {sorted(attack.cheat.sums)}; control: round 2 "
            f"{control_second.get('status', 'not run')} with {control_second.get('contributors', [])}, its sum "
            f"{'equal to' if deterministic else 'NOT equal to'} round 1's within the encoding's rounding (largest "
            f"difference {repeated}): the same input again",
            carried_out
            and deterministic
            and control_ok
            and not signed
            and not unmasked
            and refused == sorted(participants)
            and second.get("status") != "applied"
            and 2 not in attack.cheat.sums,
            reason=second.get("reason"),
            masked_inputs_after_restart=attack.contributed,
            errors={**attack.errors, **{f"control {key}": value for key, value in control.errors.items()}},
        )


# ---------------------------------------------------------------- statistics


SECTORS = ("private", "public", "self-employed")
COUNTRIES = ("United-States", "Mexico", "Philippines")
RARE_SECTOR, RARE_COUNTRY = "military", "Tuvalu"
"""Each in exactly 1 (training) row of one site: a listed category and a value of a learnt column."""
CANDIDATES = (*COUNTRIES, RARE_COUNTRY, "Canada", "Germany", "India", "Jamaica")
"""The attacker's dictionary of countries, read off the decoded sum through the public bucket hash."""
MIN_COUNT = 10
SITE_ROWS = 150


def census_schema() -> Schema:
    """age and hours (numeric), sector (listed, the rare category among them) and country (learnt)."""
    return Schema(
        label="income",
        classes=("<=50K", ">50K"),
        columns=(
            # Public ranges: under [privacy] the statistics clip each value into them (the noise scenario).
            Column("age", "numeric", None, (0.0, 120.0)),
            Column("hours", "numeric", None, (0.0, 100.0)),
            Column("sector", "categorical", (*SECTORS, RARE_SECTOR)),
            Column("country", "categorical", None),
        ),
        min_category_count=MIN_COUNT,
    )


def training_rows(workspace: Workspace, plan: AggregatorPlan, name: str, table: pd.DataFrame) -> pd.DataFrame:
    """The rows of `table` that `name`'s collaborator sums (its training split, as the collaborator makes it)."""
    config = load_collaborator_config(workspace.configs[name])
    shared = load_shared_settings(shared_settings(plan))
    return check_schema_table(config, shared, LocalTable(None, table.copy())).train


def census_federation(root: Path) -> tuple[Workspace, AggregatorPlan, dict[str, pd.DataFrame]]:
    """Four sites with their own CSV tables under a pinned plan with :func:`census_schema`; site-a holds
    RARE_COUNTRY and site-b RARE_SECTOR in one training row each. Returns each site's training rows."""
    folder = root / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.csv" for name in FOUR}
    tables = {}
    for index, name in enumerate(FOUR):
        table = institution_table(SITE_ROWS, seed=index)
        table["country"] = np.random.default_rng(100 + index).choice(COUNTRIES, SITE_ROWS, p=(0.8, 0.12, 0.08))
        table.to_csv(paths[name], index=False)
        tables[name] = table
    # min_round_size = quorum = 3, so a statistics round of three is legitimate: only the binding can refuse it.
    sections = plan_sections(secure=True, rounds=1, quorum=3, timeout=TIMEOUT)
    data = {name: {"csv": str(path)} for name, path in paths.items()}
    workspace = make_workspace(root, FOUR, plan=sections, data=data, manifest=True)
    workspace.plan.write_text(workspace.plan.read_text() + "\n" + census_schema().to_toml())
    # Pinned again, now with the [schema] (written beside the old manifest, which the plan still names, then moved).
    pinned = workspace.root / "manifest-with-schema.toml"
    write_pinned_manifest(pinned, workspace.plan, workspace.certs)
    pinned.replace(workspace.root / "manifest.toml")
    plan = load_aggregator_plan(workspace.plan)
    for name, column, value in ((FOUR[0], "country", RARE_COUNTRY), (FOUR[1], "sector", RARE_SECTOR)):
        first = training_rows(workspace, plan, name, tables[name]).index[0]
        tables[name].loc[first, column] = value
        tables[name].to_csv(paths[name], index=False)
    trained = {name: training_rows(workspace, plan, name, pd.read_csv(paths[name])) for name in FOUR}
    return workspace, plan, trained


def counted(schema: Schema, tables: Mapping[str, pd.DataFrame]) -> np.ndarray:
    """The sum of the sites' statistics vectors as it would be without suppression: every categorical cell
    counted with pandas (value_counts of each site's rows), the rest as the sites send it."""
    vector = np.sum([statistics_vector(schema, table) for table in tables.values()], axis=0)
    for column, where in statistics_slices(schema):
        if column.kind != "categorical":
            continue
        cells = np.zeros(where.stop - where.start)
        for table in tables.values():
            values = table[column.name]
            cells[-1] += int(values.isna().sum())
            for value, count in values.dropna().astype(str).value_counts().items():
                slot = (
                    column.categories.index(value)
                    if column.categories is not None
                    else category_bucket(column.name, value, schema.hash_buckets)
                )
                cells[slot] += count
        vector[where] = cells
    return vector


def small_cells(schema: Schema, vector: np.ndarray) -> list[tuple[str, int, int]]:
    """(column, cell, count) of every categorical count from 1 to min_category_count - 1 in `vector`."""
    found = []
    for column, where in statistics_slices(schema):
        if column.kind == "categorical":
            cells = vector[where]
            found += [(column.name, int(i), int(cells[i])) for i in np.flatnonzero((cells > 0) & (cells < MIN_COUNT))]
    return found


def cell(schema: Schema, vector: np.ndarray, column_name: str, value: str) -> int:
    """What `vector` holds for `value` of a categorical column (a learnt column's: its hash bucket)."""
    column, where = next((column, where) for column, where in statistics_slices(schema) if column.name == column_name)
    slot = (
        column.categories.index(value)
        if column.categories is not None
        else category_bucket(column.name, value, schema.hash_buckets)
    )
    return int(vector[where][slot])


def rewind(gate: StageGate, board: Any) -> None:
    """Let `gate` open round 0 again, as the fresh gate and board of a restarted aggregator process would (the
    cheat: a statistics checkpoint thrown away); the gate otherwise only moves forward. The board forgets round
    0's tasks too, so no collaborator answers a stage of the previous run into this one."""
    gate.restart_at(STATISTICS_ROUND)
    board.new_round(STATISTICS_ROUND)


@dataclass
class StatisticsRerun:
    """The statistics aggregation (round 0) three times: "first" with every site; then, once the harness
    has restarted the collaborators (`first_done`, then `proceed`), "again" with every site (the control) and
    "without" `leave_out`. Each decoded sum is kept, and each run's uploads (the tap's, swapped per run)."""

    leave_out: str
    tap: StageTap
    first_done: threading.Event = field(default_factory=threading.Event)
    proceed: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    uploads: dict[str, dict[tuple[int, str], list[str]]] = field(default_factory=dict)
    expected: dict[str, dict[tuple[int, str], list[str]]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def adjust(self, loop: RoundLoop) -> None:
        run, participants = loop.driver.run, loop.choose_participants
        current = ["first"]

        def recording(round_number: int, stages: Any, *args: Any, **options: Any) -> SumOutcome:
            outcome = run(round_number, stages, *args, **options)
            if options.get("kind") == STATISTICS_KIND:
                self.sums[current[0]] = outcome.weighted_sum.copy()
            return outcome

        def chosen(round_number: int, **options: Any) -> frozenset[str]:
            connected = participants(round_number, **options)
            return connected - {self.leave_out} if current[0] == "without" else connected

        def statistics(label: str) -> None:
            current[0] = label
            self.tap.uploads, self.tap.expected = {}, {}
            try:
                loop.federate_statistics()
            except StatisticsError as error:
                self.failures[label] = str(error)
            finally:
                self.uploads[label], self.expected[label] = self.tap.uploads, self.tap.expected

        def cheat() -> dict[str, Any]:
            try:
                statistics("first")
                # Forget the first run's tasks before the harness restarts the collaborators: the new
                # processes must not answer a stage of it, whose upload would carry the same binding as the
                # re-run's and land in it (a restarted aggregator's fresh board holds none either).
                loop.network.board.new_round(STATISTICS_ROUND)
                self.first_done.set()
                if self.proceed.wait(RUN_SECONDS):
                    for label in ("again", "without"):
                        rewind(loop.network.gate, loop.network.board)
                        statistics(label)
                return {}
            finally:
                self.first_done.set()
                self.done.set()

        loop.driver.run = recording  # type: ignore[method-assign]
        loop.choose_participants = chosen  # type: ignore[method-assign]
        loop.run = cheat  # type: ignore[method-assign]


@dataclass
class StatisticsRun:
    schema: Schema
    trained: dict[str, pd.DataFrame]
    cheat: StatisticsRerun
    said: list[str]
    restarted: bool
    bindings_kept: list[str]
    errors: dict[str, str]


def statistics_run(root: Path, leave_out: str) -> StatisticsRun:
    workspace, plan, trained = census_federation(root)
    assert plan.schema is not None
    tap = StageTap()
    cheat = StatisticsRerun(leave_out, tap)
    aggregator = LoopAggregator(plan, tap.install, cheat.adjust)
    board = aggregator.network.board if aggregator.network is not None else None
    restarted, kept = False, list[str]()
    with collaborator_log() as said:
        groups = [HonestCollaborators.start(workspace, FOUR, fixed)]
        try:
            if board is not None and cheat.first_done.wait(RUN_SECONDS) and "first" in cheat.sums:
                restarted, kept = restart_collaborators(workspace, board, groups, fixed)
            cheat.proceed.set()
            cheat.done.wait(RUN_SECONDS)
        finally:
            for group in groups:
                group.stop()
            aggregator.stop()
    errors = run_errors(groups, aggregator)
    return StatisticsRun(plan.schema, trained, cheat, said, restarted and len(groups) == 2, kept, errors)


def statistics_row(root: Path, book: RowBook) -> None:
    left_out = FOUR[0]
    with book.row(
        f"statistics: a [schema] federation under secure aggregation where {FOUR[0]} holds country = "
        f"{RARE_COUNTRY!r} (a learnt column) and {FOUR[1]} sector = {RARE_SECTOR!r} (a listed one) in 1 row each; "
        "the aggregator decodes the statistics sum (round 0) and reads every cell, countries through the public "
        f"bucket hash and a dictionary; then, the collaborators restarted, it re-runs round 0 without {left_out}: "
        f"the difference of the sums would be {left_out}'s vector",
        f"the decoded sum holds no categorical count from 1 to min_category_count - 1 = {MIN_COUNT - 1} and 0 for "
        "both rare values, whereas the same tables counted without suppression (pandas, offline) hold them at 1 "
        "(the control); the restarted collaborators sign round 0 again with every site (the same sum decoded, "
        f"the control) and none signs it without {left_out}: nothing decoded",
        PATCHED_AGGREGATOR,
    ) as row:
        attack = statistics_run(root, left_out)
        schema, cheat = attack.schema, attack.cheat
        decoded = cheat.sums.get("first")
        offline = np.sum([statistics_vector(schema, table) for table in attack.trained.values()], axis=0)
        unsuppressed = counted(schema, attack.trained)
        rare = (("country", RARE_COUNTRY), ("sector", RARE_SECTOR))
        # The premises: the decoded sum is these tables' (as the sites send them), and counted without
        # suppression the rare values are there, 1 row each, in cells of their own.
        others = {category_bucket("country", value, schema.hash_buckets) for value in COUNTRIES}
        premise = (
            decoded is not None
            and np.array_equal(decoded, offline)
            and all(cell(schema, unsuppressed, column, value) == 1 for column, value in rare)
            and category_bucket("country", RARE_COUNTRY, schema.hash_buckets) not in others
        )
        would_show = small_cells(schema, unsuppressed)
        shown = small_cells(schema, decoded) if decoded is not None else None
        read = {value: cell(schema, decoded, "country", value) for value in CANDIDATES} if decoded is not None else {}
        rare_read = (
            {value: cell(schema, decoded, column, value) for column, value in rare} if decoded is not None else {}
        )
        suppressed = premise and shown == [] and set(rare_read.values()) == {0} and bool(would_show)
        # Differencing: round 0 again with every site (the control), then without left_out.
        participants = cheat.expected.get("without", {}).get((STATISTICS_ROUND, "STAGE_EVAL_ADVERTISE_KEYS"), [])
        again = cheat.sums.get("again")
        control_ok = again is not None and decoded is not None and np.array_equal(again, decoded)
        refusals = {
            name: lines_of(attack.said, name, "already signed for with other survivors") for name in participants
        }
        refused = sorted(name for name, lines in refusals.items() if lines)
        without = cheat.uploads.get("without", {})
        signed = sorted(set(without.get((STATISTICS_ROUND, "STAGE_EVAL_CONSISTENCY"), [])))
        unmasked = sorted(set(without.get((STATISTICS_ROUND, "STAGE_EVAL_UNMASK"), [])))
        carried_out = attack.restarted and participants == sorted(set(FOUR) - {left_out})
        said = next((lines[0] for lines in refusals.values() if lines), None)
        row.record(
            f"decoded sum: {'equal to' if premise else 'NOT as expected against'} the sites' suppressed vectors "
            f"(computed offline); categorical counts from 1 to {MIN_COUNT - 1} in it: {shown}; the rare values' "
            f"cells: {rare_read}; the dictionary read: {read}; control: counted without suppression the same "
            f"tables hold {would_show} (column, cell, count). Collaborators restarted: {attack.restarted} (bindings "
            f"kept by {attack.bindings_kept}); round 0 again with every site: "
            f"{'decoded, the same sum' if control_ok else 'NOT decoded as before: ' + repr(short(cheat.failures.get('again'), 400)) + ', the sites said ' + repr([short(line, 200) for line in attack.said if 'round 0' in line][:6])}; "
            f"round 0 without {left_out}: "
            f"participants {participants}, consistency signatures {signed or 'none'}, unmasking responses "
            f"{unmasked or 'none'}, refused: {refused}, e.g. {short(said, 300)!r}; sums decoded: {sorted(cheat.sums)}",
            suppressed
            and carried_out
            and control_ok
            and not signed
            and not unmasked
            and refused == participants
            and "without" not in cheat.sums
            and "without" in cheat.failures,
            failure=short(cheat.failures.get("without"), 600),
            errors=attack.errors,
        )


# ---------------------------------------------------------------- evaluation query


AGE_FEATURE = 0
"""Adult's standardised age: encode_features keeps the columns' order, and age comes first."""
CRAFTED_WEIGHT, CRAFTED_BIAS = 10.0, 40.0
REVIEW_GRID = (20.0, 80.0)
QUERY_OPERATOR = (
    "cheating aggregator (fedfair's aggregator, its plan edited past its manifest or its round loop patched)"
)


def crafted_state(state: server.ServerState) -> server.ServerState:
    """The review's query: a logistic model whose logit is 10 z_age + 40, so that a label-0 row's loss
    (softplus of the logit) is about 10 z_age + 40, in [20, 80] for ages within 2 standard deviations."""
    theta = torch.zeros_like(state.theta_average)
    theta[AGE_FEATURE] = CRAFTED_WEIGHT
    theta[-1] = CRAFTED_BIAS  # nn.Linear(features, 1): the weights, then the bias
    return dataclasses.replace(state, theta=theta.clone(), theta_average=theta, c=0.5, c_average=0.5)


@dataclass
class EvaluationQuery:
    """The round loop replaced by two evaluations of the crafted model: in round 1 with every connected
    site, in round 2 (a round whose training "failed", leaving the model as it was) without `leave_out`.
    `second` makes round 2's model from round 1's (by default the same; the noise scenario moves it one
    ulp). Every evaluation sum the aggregator decodes is kept, with its contributors, and each round's
    model digest as the model travels."""

    leave_out: str
    second: Callable[[server.ServerState], server.ServerState] = lambda state: state
    done: threading.Event = field(default_factory=threading.Event)
    sums: dict[int, tuple[np.ndarray, tuple[str, ...]]] = field(default_factory=dict)
    results: dict[int, dict[str, Any]] = field(default_factory=dict)
    models: dict[int, str] = field(default_factory=dict)

    def adjust(self, loop: RoundLoop) -> None:
        run = loop.driver.run

        def recording(round_number: int, stages: Any, *args: Any, **options: Any) -> SumOutcome:
            outcome = run(round_number, stages, *args, **options)
            if stages is EVALUATION:
                self.sums[round_number] = (outcome.weighted_sum.copy(), outcome.contributors)
            return outcome

        def cheat() -> dict[str, Any]:
            try:
                start = loop.starting_checkpoint
                assert start is not None  # no [schema]: prepare() gives round 0's checkpoint
                crafted = crafted_state(start.state)
                for round_number, left, state in ((1, None, crafted), (2, self.leave_out, self.second(crafted))):
                    loop.checkpoint = dataclasses.replace(start, state=state)
                    self.models[round_number] = model_digest(
                        model_download(state.theta_average.numpy(), True), state.c_average
                    )
                    loop.choose_participants(round_number, wait_for_everyone=True)
                    loop.network.board.new_round(round_number)
                    if left is not None:
                        loop.excluded[left] = "left out by the aggregator"
                    self.results[round_number] = loop.evaluate(round_number)
                return {}
            finally:
                self.done.set()

        loop.driver.run = recording  # type: ignore[method-assign]
        loop.run = cheat  # type: ignore[method-assign]


@dataclass
class QueryRun:
    cheat: EvaluationQuery
    tap: StageTap
    said: list[str]
    errors: dict[str, str]
    aggregator_error: str | None


def query_run(root: Path, leave_out: str, served: Mapping[str, Mapping[str, Any]] | None) -> QueryRun:
    """The pinned four-site federation (min_round_size 3) against EvaluationQuery; `served` edits the plan the
    aggregator serves past its manifest (None: the pinned plan). Two rounds, each evaluated, so that both are
    evaluations the plan names: a collaborator refuses any other before it downloads a model."""
    workspace = pinned_workspace(root, quorum=3, rounds=2, evaluation={"every": 1})
    plan = load_aggregator_plan(workspace.plan, served, check_manifest=served is None)
    cheat, tap = EvaluationQuery(leave_out), StageTap()
    aggregator = LoopAggregator(plan, tap.install, cheat.adjust)
    with collaborator_log() as said:
        group = HonestCollaborators.start(workspace, FOUR, fixed)
        try:
            if served is None:
                cheat.done.wait(RUN_SECONDS)
            else:
                group.join(RUN_SECONDS)  # they refuse the plan and stop
        finally:
            group.stop()
            aggregator.stop()
    return QueryRun(cheat, tap, said, dict(group.errors), aggregator.error)


def pooled_histogram(plan: AggregatorPlan, summed: np.ndarray, low: float, high: float) -> tuple[int, int, int]:
    """What an evaluation sum still tells of losses in [low, high] on the plan's grid: (thresholds there,
    losses between the first and the last of them, buckets holding at least one)."""
    grid = sums.threshold_grid(plan.evaluation.loss_range)
    nodes = 2 * grid.size - 1  # the histogram tree's leaves come first, their offset sums after the nodes
    leaves, offsets = np.rint(summed[: grid.size]), summed[nodes : nodes + grid.size]
    above = sums.cumulative(leaves, offsets, grid)[0]  # A(t_j): the count of losses above each threshold
    inside = np.flatnonzero((grid >= low) & (grid <= high))
    if inside.size < 2:
        return int(inside.size), 0, 0
    counts = above[inside[:-1]] - above[inside[1:]]
    return int(inside.size), int(above[inside[0]] - above[inside[-1]]), int(np.count_nonzero(counts))


def evaluation_query_row(root: Path, book: RowBook) -> None:
    left_out = FOUR[-1]
    with book.row(
        f"evaluation query: the aggregator evaluates a crafted logistic model (weight {CRAFTED_WEIGHT:g} on age, bias "
        f"{CRAFTED_BIAS:g}: a label-0 row's loss is about {CRAFTED_WEIGHT:g} z_age + {CRAFTED_BIAS:g}) (a) serving a "
        f"plan with loss_range = {list(REVIEW_GRID)}, where the grid would read the label-0 held-out rows' age "
        f"histogram; (b) under the pinned plan, twice (rounds 1 and 2, the model unchanged), the second time "
        f"without {left_out}: the difference would be {left_out}'s held-out histogram",
        "(a) every collaborator refuses the plan (plan-mismatch naming evaluation.loss_range) and nobody evaluates; "
        "(b) every site sits both evaluations out: the crafted model is not one its model chain made of the sums "
        "it verified (issue 79), so it evaluates nothing and nothing is decoded",
        QUERY_OPERATOR,
    ) as row:
        grid = query_run(root / "served-grid", left_out, {"evaluation": {"loss_range": list(REVIEW_GRID)}})
        refused_plan = sorted(
            name
            for name, error in grid.errors.items()
            if "plan-mismatch" in error and "not the plan pinned" in error and "evaluation.loss_range" in error
        )
        grid_ok = refused_plan == list(FOUR) and not grid.cheat.sums and not grid.tap.uploads
        pinned = query_run(root / "pinned", left_out, None)
        cheat, tap = pinned.cheat, pinned.tap
        first, second = cheat.results.get(1, {}), cheat.results.get(2, {})
        contributors = sorted(cheat.sums[1][1]) if 1 in cheat.sums else []
        sat_out = sorted(name for name in FOUR if lines_of(pinned.said, name, "cannot check the model it was sent"))
        participants = tap.expected.get((2, "STAGE_EVAL_ADVERTISE_KEYS"), [])
        refusals = {name: lines_of(pinned.said, name, "cannot check the model it was sent") for name in participants}
        refused = sorted(name for name, lines in refusals.items() if lines)
        signed = tap.sent(2, "STAGE_EVAL_CONSISTENCY")
        unmasked = tap.sent(2, "STAGE_EVAL_UNMASK")
        said = next((lines[0] for lines in refusals.values() if lines), None)
        plan = load_aggregator_plan(root / "pinned" / "aggregator" / "plan.toml")
        thresholds, losses, buckets = (
            pooled_histogram(plan, cheat.sums[1][0], *REVIEW_GRID) if 1 in cheat.sums else (0, 0, 0)
        )
        example = next(iter(grid.errors.values()), "")
        row.record(
            f"(a) served loss_range {list(REVIEW_GRID)}: refused (plan-mismatch) by {refused_plan}, "
            f"{FOUR[0]} saying {served_differences(example) or short(example)!r}; uploads: "
            f"{sorted(grid.tap.uploads) or 'none'}; sums decoded: {sorted(grid.cheat.sums) or 'none'}. (b) pinned "
            f"plan: sites that sat the crafted model out {sat_out}; round 1 evaluation {first.get('status', 'not run')}"
            f" with {contributors}; round 2 without {left_out}: participants {participants}, consistency signatures "
            f"{signed or 'none'}, unmasking responses {unmasked or 'none'}, sat out: {refused}, e.g. "
            f"{short(said, 300)!r}; evaluation {second.get('status', 'not run')}; sums decoded in rounds "
            f"{sorted(cheat.sums)} (the pinned grid has {thresholds} thresholds in {list(REVIEW_GRID)}; {losses} "
            f"pooled held-out losses decoded in {buckets} of its buckets there)",
            grid_ok
            and sat_out == list(FOUR)
            and first.get("status") != "done"
            and 1 not in cheat.sums
            and not signed
            and not unmasked
            and refused == participants
            and second.get("status") != "done"
            and 2 not in cheat.sums,
            reason=second.get("reason"),
            refusal=short(example, 1000),
            errors={**{f"(a) {k}": v for k, v in grid.errors.items() if k not in refused_plan}, **pinned.errors},
            aggregator_errors={"(a)": short(grid.aggregator_error, 200), "(b)": short(pinned.aggregator_error, 200)},
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
