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
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from torch import nn

from attacks.cheating import PatchedAggregator
from attacks.federation import FixedTrainer, HonestCollaborators, plan_sections, trainer_factory
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.bundle import Bundle, builtin_architecture, factory_architecture, make_provenance, write_bundle
from fedfair.cli import main as fedfair_main
from fedfair.core.models import build_model
from fedfair.datasets.schema import draft_schema, encoder_from_statistics, statistics_vector
from fedfair.pki.roster import pins_from_folders, write_manifest
from fedfair.research.workspace import Workspace, make_workspace
from fedfair.runtime.aggregator.board import UploadHandler
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.driver import SumOutcome
from fedfair.runtime.aggregator.loop import GOODBYE_SECONDS, Network, RoundLoop, prepare, serve
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.trainer import TrainerFactory
from fedfair.runtime.contract import TRAINING
from fedfair.runtime.manifest import load_manifest
from fedfair.runtime.plan import AggregatorPlan, load_aggregator_plan, plan_digest
from fedfair.runtime.settings import ADULT_FEATURES
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
            loop._evaluation_due = lambda round_number: False  # type: ignore[method-assign]
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
            binding: pb.Binding, expected: Any, inputs: bytes | Mapping[str, bytes], handler: UploadHandler, **options: Any
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


@contextmanager
def collaborators_said() -> Iterator[list[str]]:
    """Every warning or error the collaborators log while the block runs ("NAME: ..." lines)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("fedfair.collaborator")
    handler, level, propagate = Collect(logging.WARNING), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


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
    with collaborators_said() as said:
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
    write_manifest(roster_only, FEDERATION_ID, pins_from_folders([workspace.certs]), 0, 4)
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
            name for name in FOUR if "plan-mismatch" in group.errors.get(name, "") and all(
                word in group.errors[name] for word in fields
            )
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
            dataclasses.replace(genuine, architecture=factory_architecture("os:system", {"command": f"touch '{shell_marker}'"})),
        )
        outcomes: dict[str, tuple[int, str]] = {}
        for name in (FACTORY, "os:system"):
            outcomes[f"{name}, nothing allowed"] = predict(paths[name], data, root / "hostile.csv")
            outcomes[f"{name}, torch.nn:Identity allowed"] = predict(
                paths[name], data, root / "hostile.csv", "torch.nn:Identity"
            )
        ran_before = marked_by(markers) + ([shell_marker.name] if shell_marker.exists() else [])
        refused = {
            attempt: code == 2 and "it was not imported" in message
            for attempt, (code, message) in outcomes.items()
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
        train, participants, run = loop.train, loop._participants, loop.driver.run

        def held_train(round_number: int, **options: Any) -> dict[str, Any]:
            if round_number == 2:
                self.first_done.set()
                self.proceed.wait(RUN_SECONDS)
            before = loop.checkpoint.state
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
        loop._participants = chosen  # type: ignore[method-assign]
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
    restarted, kept = False, []
    errors: dict[str, str] = {}
    with collaborators_said() as said:
        groups = [HonestCollaborators.start(workspace, FOUR, real)]
        try:
            if board is not None and cheat.first_done.wait(RUN_SECONDS):
                groups[0].stop()
                groups[0].join(15)
                kept = sorted(
                    name for name in FOUR if (workspace.configs[name].parent / f"{name}.{FEDERATION_ID}.bindings.json").exists()
                )
                wait_until(lambda: not board.connected() & set(FOUR), 15)
                groups.append(HonestCollaborators.start(workspace, FOUR, real))
                restarted = wait_until(lambda: board.connected() >= set(FOUR), 30)
            cheat.proceed.set()
            groups[-1].join(RUN_SECONDS)
        finally:
            for group in groups:
                group.stop()
            aggregator.stop()
    for index, group in enumerate(groups):
        errors.update({f"{name} (run {index + 1})": error for name, error in group.errors.items()})
    if aggregator.error:
        errors["aggregator"] = aggregator.error
    contributed = {name: list(collaborator.contributed_rounds) for name, collaborator in groups[-1].collaborators.items()}
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
        refusals = {name: lines_of(attack.said, name, "already signed for with other survivors") for name in participants}
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
