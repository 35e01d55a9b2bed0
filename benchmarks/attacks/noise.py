"""What the aggregator decodes once the plan's ``[privacy]`` noises it (issue 41's acceptance rows).

Each row runs the pinned federation of :mod:`attacks.consent` (real collaborators in threads, mutual TLS
on loopback, ``dropouts = "allowed"``, the default) against fedfair's own aggregator, its round loop
patched (:class:`~attacks.consent.LoopAggregator`), and measures the decoded sums against the exact
ones, computed in-process from what each honest site computed before encoding (its seams wrapped: the
evaluation answers, the composition counts, the trained update). Each row states the noise scale the
aggregator faces (the ``noise_std`` it records itself) and the epsilon each site's ledger
(``NAME.DATA.ledger.json``, its releases) charged, and is handled only when the error is of the
order of that noise (nothing exact), the ledger charged one release per fresh answer, and a control
without noise shows the attack exact (so the noise, not a broken harness, is what hides the answer):

- evaluation: the crafted logistic model of :func:`attacks.consent.crafted_state` (its losses inside the
  pinned grid) evaluated with every site under ``[privacy] report_epsilon = 1``: the decoded pooled
  histogram against the exact pooled one;
- 1-ulp difference: that model with every site (round 1), then the model one ulp away without one site
  (round 2, a fresh binding): the difference of the two decoded sums against that site's histogram;
- composition: a ``[schema]`` federation counting the worst group by a listed column, its final
  evaluation served with a c of the aggregator's choosing and then again with a second c: the counts
  follow the served c (the record's c-bar), once: the second query is refused, the counts (a cell and its complement) are
  noised, and without noise the sites suppress a small cell and its complement jointly;
- training differencing: ``[privacy] mode = "distributed"`` (epsilon 3 over the plan's rounds), round 1
  on model M with every site, round 2 on M + 1 ulp without the victim: the difference of the decoded sums
  against the victim's update (cosine, relative error), beside the same attack without privacy.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import tomli_w
import torch

from attacks.cheating import collaborator_log
from attacks.consent import (
    AGE_FEATURE,
    COUNTRIES,
    FOUR,
    MIN_COUNT,
    RARE_SECTOR,
    RUN_SECONDS,
    TIMEOUT,
    EvaluationQuery,
    LoopAggregator,
    StageTap,
    census_schema,
    fixed,
    institution_table,
    lines_of,
    pinned_workspace,
    round_log,
    short,
)
from attacks.federation import HonestCollaborators, kept_state, plan_sections, wire_ulp_up
from attacks.rows import RowBook
from fedfair.core.evaluation import evaluate
from fedfair.fairness import sums, tail
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.rounds import RoundJob
from fedfair.runtime.collaborator.trainer import LocalTable, check_schema_table
from fedfair.runtime.composition_counts import local_counts
from fedfair.runtime.contract import EVALUATION, TRAINING
from fedfair.runtime.local.workspace import Workspace, declared_sizes, make_workspace, write_pinned_manifest
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, load_shared_settings, shared_settings
from fedfair.runtime.transport import fedfair_pb2 as pb

FEDERATION_ID = "fedfair-launch"  # what make_workspace writes
VICTIM = FOUR[-1]
REPORT_PRIVACY = {"report_epsilon": 1.0, "budget": 10.0, "delta": 1e-5}
"""The evaluation rows' [privacy]: one answer spends epsilon 1 at delta 1e-5, within a budget of 10."""
NOISE_BAND = (0.3, 3.0)
"""A row's error must be within these multiples of the noise scale the aggregator states: of its order."""
OPERATOR = "cheating aggregator (fedfair's aggregator, its round loop patched) against real collaborators"


# ---------------------------------------------------------------- shared measurements


def ledger(workspace: Workspace, names: tuple[str, ...], delta: float) -> dict[str, dict[str, Any]]:
    """Each site's ledger: its releases as (kind, round) and the epsilon they compose to at `delta`."""
    found: dict[str, dict[str, Any]] = {}
    for name in names:
        site = open_ledger(load_collaborator_config(workspace.configs[name]))
        found[name] = {
            "releases": [(entry["kind"], int(entry["round"])) for entry in site.releases()],  # type: ignore[call-overload]
            "epsilon": round(site.spent(delta), 4),
        }
    return found


def within(ratio: float | None) -> bool:
    return ratio is not None and NOISE_BAND[0] <= ratio <= NOISE_BAND[1]


def gaussian_max(count: int) -> float:
    """About the largest |N(0, 1)| of `count` draws: what the max error over `count` noised values is, in stds."""
    return math.sqrt(2.0 * math.log(max(count, 2)))


def error_figures(error: np.ndarray, std: float) -> dict[str, Any]:
    """The error of a decoded vector against the truth, in units of the stated noise std: RMS (expected 1),
    max (expected about :func:`gaussian_max`) and the share of coordinates read exactly (rounded to counts)."""
    if std <= 0.0 or error.size == 0:
        return {"rms_in_std": None, "max_in_std": None, "max_over_expected": None, "exact_share": None}
    rms = float(np.sqrt(np.mean(error**2))) / std
    largest = float(np.abs(error).max()) / std
    return {
        "rms_in_std": round(rms, 3),
        "max_in_std": round(largest, 3),
        "max_over_expected": round(largest / gaussian_max(error.size), 3),
        "exact_share": round(float(np.mean(np.abs(error) < 0.5)), 4),
    }


def unexact(figures: Mapping[str, Any]) -> bool:
    """Whether under half of the coordinates were read exactly (a noised answer of few coordinates may have none)."""
    share = figures.get("exact_share")
    return share is not None and share < 0.5


def leaves(vector: np.ndarray) -> np.ndarray:
    """The histogram tree's leaf counts (the first K coordinates of an exact evaluation vector; all of a noised
    answer's few tail sums)."""
    return vector[: sums.THRESHOLDS]


def rows_of(vector: np.ndarray) -> float:
    """The held-out rows an evaluation vector counts: the exact tree's root, or a noised answer's row count."""
    if vector.size == sums.vector_length():
        return float(vector[2 * sums.THRESHOLDS - 2])
    return float(vector[0]) / float(tail.TailQuery(1.0).weights()[0])


# ---------------------------------------------------------------- evaluation and its 1-ulp difference


def one_ulp(state: Any) -> Any:
    """`state` with a weight the crafted model leaves at 0 moved one float32 ulp up (the smallest float32 above
    0, as the model travels): another model digest, and in the float32 model every logit, so every loss and
    every answer, exactly as before but for the noise. (A ulp on the age weight of 10 would move a site's loss
    sums by 1e-3: the control could no longer read the victim exactly.)"""
    theta = state.theta_average.clone()
    theta[AGE_FEATURE + 1] = wire_ulp_up(float(theta[AGE_FEATURE + 1]))
    return dataclasses.replace(state, theta=theta.clone(), theta_average=theta)


@dataclass
class Answers:
    """Each site's evaluation answers as it computed them, before encoding, noise and masking, in order."""

    by_site: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def adjust(self, name: str, collaborator: Collaborator) -> None:
        answer = collaborator._evaluation_answers

        def recorded(theta: torch.Tensor, c: float) -> np.ndarray:
            vector = answer(theta, c)
            self.by_site.setdefault(name, []).append(np.array(vector, dtype=np.float64))
            return vector

        collaborator._evaluation_answers = recorded  # type: ignore[method-assign]


@dataclass
class EvaluationRun:
    workspace: Workspace
    query: EvaluationQuery
    answers: Answers
    said: list[str]
    errors: dict[str, str]


def evaluation_run(root: Path, *, noised: bool) -> EvaluationRun:
    """The pinned four-site federation (min_round_size 3, dropouts allowed) against consent's EvaluationQuery
    with round 2 on M + 1 ulp, under REPORT_PRIVACY when `noised`, else with exact evaluation sums (the control)."""
    extra = {"privacy": REPORT_PRIVACY} if noised else {}
    # Both rounds evaluated: a collaborator answers only the evaluations its plan names.
    workspace = pinned_workspace(root, quorum=3, rounds=2, evaluation={"every": 1}, **extra)
    plan = load_aggregator_plan(workspace.plan)
    query, answers = EvaluationQuery(VICTIM, one_ulp), Answers()
    aggregator = LoopAggregator(plan, StageTap().install, query.adjust)
    with collaborator_log() as said:
        group = HonestCollaborators.start(workspace, FOUR, fixed, adjust=answers.adjust)
        try:
            query.done.wait(RUN_SECONDS)
        finally:
            group.stop()
            aggregator.stop()
    errors = {**group.errors, **({"aggregator": aggregator.error} if aggregator.error else {})}
    return EvaluationRun(workspace, query, answers, said, errors)


@dataclass
class EvaluationFigures:
    """The two evaluations measured: the pooled sum's error and the difference's, against the exact ones."""

    carried_out: bool
    pooled: dict[str, Any]
    difference: dict[str, Any]
    stds: dict[int, float]
    victim_rows: int
    ledger: dict[str, dict[str, Any]]


def measure_evaluation(run: EvaluationRun, delta: float) -> EvaluationFigures:
    query, answers = run.query, run.answers.by_site
    first, second = query.sums.get(1), query.sums.get(2)
    carried_out = (
        first is not None
        and second is not None
        and sorted(first[1]) == list(FOUR)
        and sorted(second[1]) == sorted(set(FOUR) - {VICTIM})
        and all(len(answers.get(name, [])) == (1 if name == VICTIM else 2) for name in FOUR)
        and query.models.get(1) != query.models.get(2)
    )
    stds = {number: float(query.results.get(number, {}).get("noise_std", 0.0) or 0.0) for number in (1, 2)}
    pooled: dict[str, Any] = {}
    difference: dict[str, Any] = {}
    victim_rows = 0
    if carried_out:
        assert first is not None and second is not None
        exact_first = np.sum([answers[name][0] for name in FOUR], axis=0)
        exact_second = np.sum([answers[name][1] for name in FOUR if name != VICTIM], axis=0)
        victim = answers[VICTIM][0]
        victim_rows = int(round(rows_of(victim)))
        error = first[0] - exact_first
        pooled = {"all": error_figures(error, stds[1]), "leaves": error_figures(leaves(error), stds[1])}
        pooled["largest_abs_error"] = round(float(np.abs(error).max()), 3)
        # The attacker's reading: round 1 less round 2, as if it were the victim's own histogram.
        read = first[0] - second[0]
        std = math.hypot(stds[1], stds[2])
        difference = {
            "std": round(std, 3),
            "against_victim": error_figures(read - victim, std),
            "leaves": error_figures(leaves(read - victim), std),
            # The other sites' answers on M and M + 1 ulp, as they computed them: equal (the premise).
            "others_unchanged": bool(
                np.array_equal(leaves(exact_first - victim), leaves(exact_second))
                and np.abs(exact_first - victim - exact_second).max() < 1e-9
            ),
            # One coordinate counts every held-out row: one noise draw.
            "rows_read": round(rows_of(read), 1),
        }
    return EvaluationFigures(carried_out, pooled, difference, stds, victim_rows, ledger(run.workspace, FOUR, delta))


def evaluation_rows(root: Path, book: RowBook) -> None:
    """The evaluation row and the 1-ulp difference row, from one noised run and one exact control run."""
    delta = float(REPORT_PRIVACY["delta"])
    runs: dict[str, EvaluationRun] = {}
    figures: dict[str, EvaluationFigures] = {}

    def measured(kind: str) -> EvaluationFigures:
        if kind not in figures:
            runs[kind] = evaluation_run(root / kind, noised=kind == "noised")
            figures[kind] = measure_evaluation(runs[kind], delta)
        return figures[kind]

    with book.row(
        "noise, evaluation: the aggregator evaluates the crafted logistic model (weight 10 on age, bias 40; its "
        "held-out losses inside the pinned grid) with all four sites under [privacy] report_epsilon = 1 "
        "(delta 1e-5, budget 10): the decoded sum would be the pooled held-out histogram",
        "the decoded pooled histogram differs from the exact one (the sites' own answers, summed in-process) by "
        f"the noise the aggregator states: RMS error within {list(NOISE_BAND)} x its noise_std, the largest "
        "error of the order of the largest of as many Gaussian draws, nothing exact; each site's ledger holds "
        "one evaluate release for that answer; without [privacy] (the control) the same query decodes the "
        "exact histogram",
        OPERATOR,
    ) as row:
        noised, exact = measured("noised"), measured("exact")
        std = noised.stds[1]
        figures_all = noised.pooled.get("all", {})
        control_error = exact.pooled.get("largest_abs_error")
        ledger_ok = all(
            (("evaluate", 1) in entry["releases"]) and entry["epsilon"] > 0 for entry in noised.ledger.values()
        )
        single = noised.ledger.get(VICTIM, {})
        row.record(
            f"noised: stated noise_std {std:.4g} per decoded coordinate (4 answers); over the "
            f"{tail.TailQuery(1.0).length} coordinates the error is {figures_all.get('rms_in_std')} std RMS, "
            f"{figures_all.get('max_in_std')} std at most ({figures_all.get('max_over_expected')} x the expected "
            f"largest), {figures_all.get('exact_share')} of them within 0.5 of the truth; leaf counts: "
            f"{noised.pooled.get('leaves', {})}; epsilon charged per site for this answer: "
            f"{single.get('epsilon')} ({VICTIM}'s ledger: {single.get('releases')}); control without [privacy]: "
            f"largest error {control_error} (noise_std {exact.stds[1]:g}): the exact histogram",
            noised.carried_out
            and exact.carried_out
            and std > 0.0
            and within(figures_all.get("rms_in_std"))
            and within(figures_all.get("max_over_expected"))
            and unexact(figures_all)
            and ledger_ok
            and single.get("releases") == [("evaluate", 1)]
            and exact.stds[1] == 0.0
            and control_error is not None
            and control_error < 1e-3,
            noise_std=std,
            pooled=noised.pooled,
            control=exact.pooled,
            ledger=noised.ledger,
            errors={**runs["noised"].errors, **{f"control {k}": v for k, v in runs["exact"].errors.items()}},
        )

    with book.row(
        f"noise, 1-ulp difference: the crafted model M evaluated with every site (round 1), then M + 1 ulp (a new "
        f"model digest, so a fresh answer) without {VICTIM} (round 2), dropouts allowed, report_epsilon = 1: round 1 "
        f"less round 2 would be {VICTIM}'s held-out histogram",
        "the difference misses the victim's histogram by the noise of two sums (std sqrt(s1^2 + s2^2) from the "
        f"stated noise_std of each): RMS within {list(NOISE_BAND)} x it, nothing exact; the three sites that "
        f"answered twice hold two evaluate releases, {VICTIM} one; without [privacy] (the control) the "
        "difference is the victim's exact histogram",
        OPERATOR,
    ) as row:
        noised, exact = measured("noised"), measured("exact")
        diff = noised.difference
        against = diff.get("against_victim", {})
        # Exact sums: the leaf counts of the control's difference are the victim's (errors at the encoding's rounding).
        if exact.carried_out:
            run = runs["exact"]
            first, second = run.query.sums[1][0], run.query.sums[2][0]
            victim = run.answers.by_site[VICTIM][0]
            control_largest = float(np.abs((first - second) - victim).max())
            control_exact = control_largest < 1e-3 and bool(
                np.array_equal(np.rint(leaves(first - second)), leaves(victim))
            )
        else:
            control_largest, control_exact = None, False
        twice = sorted(set(FOUR) - {VICTIM})
        ledger_ok = all(
            noised.ledger[name]["releases"] == [("evaluate", 1), ("evaluate", 2)] for name in twice
        ) and noised.ledger[VICTIM]["releases"] == [("evaluate", 1)]
        spent = {name: noised.ledger[name]["epsilon"] for name in FOUR}
        row.record(
            f"noised: stated noise_std {noised.stds[1]:.4g} (round 1, 4 answers) and {noised.stds[2]:.4g} (round 2, "
            f"3 answers), so {diff.get('std')} on the difference; its error against {VICTIM}'s histogram "
            f"({noised.victim_rows} held-out rows): {against.get('rms_in_std')} std RMS, {against.get('max_in_std')} "
            f"std at most, {against.get('exact_share')} of coordinates within 0.5; its row count read off the "
            f"answer's row count {diff.get('rows_read')} (true {noised.victim_rows}); the others' answers on M and M + 1 ulp identical: "
            f"{diff.get('others_unchanged')}; epsilon spent: {spent} (two answers vs one); control without "
            f"[privacy]: largest error {control_largest}, every leaf count of {VICTIM} read exactly: {control_exact}",
            noised.carried_out
            and exact.carried_out
            and bool(diff.get("others_unchanged"))
            and within(against.get("rms_in_std"))
            and unexact(against)
            and ledger_ok
            and spent[twice[0]] > spent[VICTIM] > 0.0
            and control_exact,
            noise_std=diff.get("std"),
            difference=diff,
            control=exact.difference,
            control_largest_error=control_largest,
            epsilon=spent,
            refusals=[short(line, 200) for line in runs["noised"].said if "refus" in line][:4],
        )


# ---------------------------------------------------------------- composition counts


COMPOSITION_COLUMN = "sector"
"""The listed column the worst group is counted by (:func:`attacks.consent.census_schema`)."""
TABLE_ROWS = 3000
"""Rows per site: about 600 held out each, so that counts at two thresholds differ by many noise stds."""
SMALL_CELL = 12
"""Held-out rows of site-b set to the rare sector: a cell whose part above c or at or below it is small."""
C_TRAIN, C_ATTACK, C_SECOND = math.log(2.0), 0.2, 0.205
"""The c the aggregator trains with, the c of the model it evaluates (where every site counts: the record's
c-bar), and the second threshold it tries."""


def composition_federation(root: Path, *, noised: bool) -> tuple[Workspace, Any]:
    """Four sites with their own CSV tables (:func:`attacks.consent.institution_table`, TABLE_ROWS each) under a
    pinned plan with :func:`attacks.consent.census_schema`, one round, [evaluation] composition = [sector], and
    REPORT_PRIVACY when `noised`; SMALL_CELL held-out rows of site-b are in the rare sector."""
    folder = root / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.csv" for name in FOUR}
    for index, name in enumerate(FOUR):
        table = institution_table(TABLE_ROWS, seed=index)
        table["country"] = np.random.default_rng(100 + index).choice(COUNTRIES, TABLE_ROWS, p=(0.8, 0.12, 0.08))
        table.to_csv(paths[name], index=False)
    sections = plan_sections(secure=True, rounds=1, quorum=3, timeout=TIMEOUT)
    if noised:
        sections["privacy"] = dict(REPORT_PRIVACY)
    data = {name: {"csv": str(path)} for name, path in paths.items()}
    workspace = make_workspace(root, FOUR, plan=sections, data=data, manifest=True)
    # Composition needs the [schema], which the first manifest was written without: both added, then pinned again.
    written = tomllib.loads(workspace.plan.read_text())
    written.setdefault("evaluation", {})["composition"] = [COMPOSITION_COLUMN]
    workspace.plan.write_text(tomli_w.dumps(written) + "\n" + census_schema().to_toml())
    pinned = workspace.root / "manifest-with-schema.toml"
    write_pinned_manifest(pinned, workspace.plan, workspace.certs)
    pinned.replace(workspace.root / "manifest.toml")
    plan = load_aggregator_plan(workspace.plan)
    # The rare sector in SMALL_CELL of site-b's held-out rows (the split depends on the rows' order, not values).
    name = FOUR[1]
    table = pd.read_csv(paths[name])
    config = load_collaborator_config(workspace.configs[name])
    held_out = check_schema_table(
        config, load_shared_settings(shared_settings(plan)), LocalTable(None, table.copy())
    ).test
    table.loc[held_out.index[:SMALL_CELL], COMPOSITION_COLUMN] = RARE_SECTOR
    table.to_csv(paths[name], index=False)
    return workspace, plan


@dataclass
class CompositionQuery:
    """Round 1 trained on a model whose c is C_TRAIN (each site's mean training c); then the final
    evaluation of a crafted model (weight 1 on the first feature) with c = C_ATTACK, and again with C_SECOND
    (the stage gate rewound, as a restarted aggregator's would be). Every evaluation sum is kept."""

    sums: list[tuple[np.ndarray, tuple[str, ...]]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)

    def adjust(self, loop: RoundLoop) -> None:
        train, run = loop.train, loop.driver.run

        def recording(round_number: int, stages: Any, *args: Any, **options: Any) -> SumOutcome:
            outcome = run(round_number, stages, *args, **options)
            if stages is EVALUATION and round_number == 1:
                self.sums.append((outcome.weighted_sum.copy(), outcome.contributors))
            return outcome

        def cheat(round_number: int, **options: Any) -> dict[str, Any]:
            state = loop.checkpoint.state
            loop.checkpoint = dataclasses.replace(
                loop.checkpoint, state=dataclasses.replace(state, c=C_TRAIN, c_average=C_TRAIN)
            )
            record = train(round_number, **options)
            theta = torch.zeros_like(loop.checkpoint.state.theta_average)
            theta[0] = 1.0
            for index, c in enumerate((C_ATTACK, C_SECOND)):
                if index:
                    loop.network.board.new_round(round_number)
                    with loop.network.gate._lock:
                        loop.network.gate._last = (round_number, pb.STAGE_UNSPECIFIED)
                state = dataclasses.replace(loop.checkpoint.state, theta_average=theta.clone(), c_average=c)
                loop.checkpoint = dataclasses.replace(loop.checkpoint, state=state)
                self.results.append(loop.evaluate(round_number))
            return record

        loop.driver.run = recording  # type: ignore[method-assign]
        loop.train = cheat  # type: ignore[method-assign]


@dataclass
class Counted:
    """Each site's composition counts as it sent them (before encoding and noise), unsuppressed at the c it
    used, and as they would be at C_TRAIN, with the c it used."""

    sent: dict[str, np.ndarray] = field(default_factory=dict)
    own: dict[str, np.ndarray] = field(default_factory=dict)
    trained: dict[str, np.ndarray] = field(default_factory=dict)
    c: dict[str, float | None] = field(default_factory=dict)

    @contextmanager
    def installed(self) -> Iterator[None]:
        original = RoundJob.composition_counts

        def recorded(job: RoundJob, theta: torch.Tensor, c: float, columns: Any) -> np.ndarray:
            vector = original(job, theta, c, columns)
            name = job.config.name
            data, model = job.prepared.data, job.prepared.evaluation_model
            assert data is not None and data.held_out_levels is not None and model is not None
            losses = evaluate(model, theta, data.test).losses
            self.sent[name], self.c[name] = np.array(vector), c
            self.own[name] = local_counts(columns, data.held_out_levels, losses, c, 1)
            self.trained[name] = local_counts(columns, data.held_out_levels, losses, C_TRAIN, 1)
            return vector

        RoundJob.composition_counts = recorded  # type: ignore[method-assign, assignment]
        try:
            yield
        finally:
            RoundJob.composition_counts = original  # type: ignore[method-assign]


@dataclass
class CompositionRun:
    workspace: Workspace
    plan: Any
    query: CompositionQuery
    counted: Counted
    said: list[str]
    errors: dict[str, str]


def composition_run(root: Path, *, noised: bool) -> CompositionRun:
    workspace, plan = composition_federation(root, noised=noised)
    query, counted = CompositionQuery(), Counted()
    with counted.installed(), collaborator_log() as said:
        aggregator = LoopAggregator(plan, StageTap().install, query.adjust)
        group = HonestCollaborators.start(workspace, FOUR, fixed)
        try:
            group.join(RUN_SECONDS)
        finally:
            group.stop()
            aggregator.stop()
    errors = {**group.errors, **({"aggregator": aggregator.error} if aggregator.error else {})}
    return CompositionRun(workspace, plan, query, counted, said, errors)


def formable_small(vector: np.ndarray, width: int, minimum: int) -> list[str]:
    """Every count the aggregator can form from decoded composition counts (a cell, its complement, the
    withheld totals) that lies from 1 to `minimum` - 1."""
    counts = np.rint(vector).astype(np.int64)
    worst_total, total = int(counts[0]), int(counts[1])
    worst, everyone = counts[2 : 2 + width], counts[2 + width : 2 + 2 * width]
    formed = {f"cell {i} above c": int(worst[i]) for i in range(width)}
    formed |= {f"cell {i} all rows": int(everyone[i]) for i in range(width)}
    formed |= {f"cell {i} at or below c": int(everyone[i] - worst[i]) for i in range(width)}
    formed |= {
        "withheld above c": worst_total - int(worst.sum()),
        "withheld rows": total - int(everyone.sum()),
        "withheld at or below c": (total - worst_total) - int((everyone - worst).sum()),
    }
    return [f"{key} = {value}" for key, value in formed.items() if 0 < value < minimum]


def composition_row(root: Path, book: RowBook) -> None:
    minimum = MIN_COUNT
    with book.row(
        f"noise, composition: a [schema] federation counting the worst group by {COMPOSITION_COLUMN} (site-b holds "
        f"{SMALL_CELL} held-out rows of the rare sector {RARE_SECTOR!r}); the aggregator trains round 1 on c = "
        f"{C_TRAIN:.4g}, then serves the final evaluation with c = {C_ATTACK} and again with c = {C_SECOND} (two "
        "thresholds), and reads each cell and its complement (all rows less those above c)",
        "with report_epsilon = 1: every site counts at the served c, the c-bar the record states, not the "
        "training c (the decoded count above c is within 4 noise stds of the counts at the served c and more than "
        "4 away from those at the training c), the second threshold is refused by every site (that round was "
        f"answered for another model) and nothing is decoded, and the decoded counts, a cell's complement "
        f"included, miss the exact ones by the stated noise (RMS within {list(NOISE_BAND)} x noise_std), one "
        "evaluate release charged per site; without [privacy] (the control) the sites suppress each cell with its "
        f"complement jointly: no count the aggregator can form lies from 1 to min_category_count - 1 = {minimum - 1}, "
        "though the sites' unsuppressed counts hold such cells",
        OPERATOR,
    ) as row:
        attack = composition_run(root / "noised", noised=True)
        control = composition_run(root / "exact", noised=False)
        # A noised plan's answers are the tail sums; an exact one's, the threshold sums.
        risks = tail.TailQuery(1.0).length
        width = len(census_schema().columns[2].categories or ())
        query = attack.query
        results = [result.get("status") for result in query.results]
        carried_out = (
            len(query.sums) >= 1
            and sorted(query.sums[0][1]) == list(FOUR)
            and sorted(attack.counted.sent) == list(FOUR)
            and all(c is not None and math.isclose(c, C_ATTACK) for c in attack.counted.c.values())
        )
        figures: dict[str, Any] = {}
        own_ok = second_refused = noise_ok = False
        std = float(query.results[0].get("noise_std", 0.0) or 0.0) if query.results else 0.0
        if carried_out and std > 0.0:
            decoded = query.sums[0][0][risks:]
            exact = np.sum(list(attack.counted.sent.values()), axis=0)
            at_own = np.sum(list(attack.counted.own.values()), axis=0)
            at_training = np.sum(list(attack.counted.trained.values()), axis=0)
            error = decoded - exact
            military = list(census_schema().columns[2].categories or ()).index(RARE_SECTOR)
            complement = (decoded[2 + width + military] - decoded[2 + military]) - (
                exact[2 + width + military] - exact[2 + military]
            )
            figures = {
                "noise_std": std,
                "counts": error_figures(error, std),
                "above_c_decoded": round(float(decoded[0]), 1),
                "above_c_at_served_c": int(at_own[0]),
                "above_c_at_training_c": int(at_training[0]),
                "rare_cell_exact": {"above c": int(exact[2 + military]), "all rows": int(exact[2 + width + military])},
                "rare_complement_error_in_std": round(float(complement) / (math.sqrt(2.0) * std), 3),
                "sent_whole": all(np.array_equal(attack.counted.sent[name], attack.counted.own[name]) for name in FOUR),
            }
            own_ok = (
                abs(decoded[0] - at_own[0]) <= 4 * std
                and abs(decoded[0] - at_training[0]) > 4 * std
                and bool(figures["sent_whole"])
            )
            noise_ok = within(figures["counts"]["rms_in_std"])
        participants = sorted(attack.counted.sent)
        refusals = {name: lines_of(attack.said, name, "already answered for another model") for name in participants}
        refused = sorted(name for name, lines in refusals.items() if lines)
        second_refused = len(query.sums) == 1 and refused == list(FOUR) and results[1:] != ["done"]
        spent = ledger(attack.workspace, FOUR, float(REPORT_PRIVACY["delta"]))
        # Under [privacy] a [schema]'s statistics before round 1 are a release too, charged first.
        answered = [("statistics", 0), ("evaluate", 1)]
        ledger_ok = all(entry["releases"] == answered and entry["epsilon"] > 0 for entry in spent.values())
        # The control: exact counts, suppressed jointly at each site.
        control_small: list[str] | None = None
        premise: list[str] = []
        if control.query.sums and sorted(control.counted.sent) == list(FOUR):
            decoded = control.query.sums[0][0][risks:]
            control_small = formable_small(decoded, width, minimum)
            premise = [
                f"{name}: {small}"
                for name in FOUR
                for small in formable_small(control.counted.own[name], width, minimum)
                if small.startswith("cell")
            ]
        said = next((lines[0] for lines in refusals.values() if lines), None)
        row.record(
            f"noised: stated noise_std {std:.4g} per count; sites' c {sorted({c for c in attack.counted.c.values() if c is not None})} (served "
            f"c {C_ATTACK}); decoded count above c {figures.get('above_c_decoded')} against {figures.get('above_c_at_served_c')} "
            f"at the served c and {figures.get('above_c_at_training_c')} at the training c; the counts' error "
            f"{figures.get('counts', {}).get('rms_in_std')} std RMS, {figures.get('counts', {}).get('max_in_std')} std "
            f"at most; the rare cell (exact {figures.get('rare_cell_exact')}): its complement read with an error of "
            f"{figures.get('rare_complement_error_in_std')} x sqrt(2) std; second threshold c = {C_SECOND}: evaluations "
            f"{results}, refused by {refused}, e.g. {short(said, 200)!r}, sums decoded {len(query.sums)}; epsilon "
            f"charged: { {name: entry['epsilon'] for name, entry in spent.items()} }; control without [privacy]: "
            f"counts from 1 to {minimum - 1} formable from the decoded sum: {control_small}, while the sites' own "
            f"unsuppressed cells held {len(premise)} such, e.g. {premise[:3]}",
            carried_out
            and own_ok
            and noise_ok
            and second_refused
            and ledger_ok
            and control_small == []
            and bool(premise),
            composition=figures,
            ledger=spent,
            control_premise=premise,
            errors={**attack.errors, **{f"control {k}": v for k, v in control.errors.items()}},
        )


# ---------------------------------------------------------------- training differencing


TRAINING_PRIVACY: dict[str, Any] = {"mode": "distributed", "epsilon": 3.0, "delta": 1e-5, "budget": 10.0}
"""The training row's [privacy]: distributed DP-SGD, the plan's two rounds spending epsilon 3 at delta 1e-5."""
BATCH_FRACTION = 0.05
"""Poisson sampling rate of every site's DP-SGD step (the plan's batch_fraction), in the attack and the control."""


@dataclass
class UlpRound:
    """Round 1 on the model M with every site; round 2 on M + 1 ulp (theta[0] one ulp up: a new model digest,
    so a fresh input) without `leave_out`. Each decoded training sum is kept with its stated noise std and
    total weight."""

    leave_out: str
    sums: dict[int, tuple[np.ndarray, float, float, tuple[str, ...]]] = field(default_factory=dict)

    def adjust(self, loop: RoundLoop) -> None:
        train, participants, run = loop.train, loop._participants, loop.driver.run

        def held_train(round_number: int, **options: Any) -> dict[str, Any]:
            before = kept_state(loop.checkpoint.state)
            record = train(round_number, **options)
            if round_number == 1:  # the model is not advanced, but moved one ulp
                theta = before.theta.clone()
                theta[0] = wire_ulp_up(float(theta[0]))
                loop.checkpoint = dataclasses.replace(loop.checkpoint, state=dataclasses.replace(before, theta=theta))
            return record

        def chosen(round_number: int, **options: Any) -> frozenset[str]:
            connected = participants(round_number, **options)
            return connected - {self.leave_out} if round_number == 2 else connected

        def recording(round_number: int, stages: Any, *args: Any, **options: Any) -> SumOutcome:
            outcome = run(round_number, stages, *args, **options)
            if stages is TRAINING:
                self.sums[round_number] = (
                    outcome.weighted_sum.copy(),
                    outcome.noise_std,
                    outcome.total_weight,
                    outcome.contributors,
                )
            return outcome

        loop.train = held_train  # type: ignore[method-assign]
        loop._participants = chosen  # type: ignore[method-assign]
        loop.driver.run = recording  # type: ignore[method-assign]


@dataclass
class Updates:
    """Each site's trained update as it computed it, before encoding, noise and masking: [w delta, w delta_c]
    and w, by round."""

    by_site: dict[str, dict[int, tuple[np.ndarray, float]]] = field(default_factory=dict)

    def adjust(self, name: str, collaborator: Collaborator) -> None:
        train_on = collaborator._train_on

        def recorded(stub: Any, binding: Any, *args: Any, **options: Any) -> Any:
            trained = train_on(stub, binding, *args, **options)
            if trained.vector is not None:
                self.by_site.setdefault(name, {})[int(binding.round)] = (np.array(trained.vector), trained.weight)
            return trained

        collaborator._train_on = recorded  # type: ignore[method-assign]


@dataclass
class TrainingRun:
    workspace: Workspace
    cheat: UlpRound
    updates: Updates
    log: dict[int, dict[str, Any]]
    errors: dict[str, str]


def training_run(root: Path, *, private: bool, batch_fraction: float = BATCH_FRACTION) -> TrainingRun:
    """The pinned four-site federation (min_round_size 3, dropouts allowed, declared sizes, one local step a
    round at `batch_fraction`, 64-bit words) against :class:`UlpRound`; under TRAINING_PRIVACY when `private`,
    else without [privacy] (the controls)."""
    sources = {name: {"dataset": "adult", "partition": "race", "index": index} for index, name in enumerate(FOUR)}
    sections: dict[str, dict[str, Any]] = {
        "training": {"local_steps": 1, "batch_fraction": batch_fraction},
        "secure_aggregation": {"modulus_bits": 64},
        "influence": {"weights": "declared", "sizes": declared_sizes(sources, 0) or {}},
    }
    if private:
        sections["privacy"] = TRAINING_PRIVACY
    workspace = pinned_workspace(root, quorum=3, rounds=2, **sections)
    plan = load_aggregator_plan(workspace.plan)
    cheat, updates = UlpRound(VICTIM), Updates()
    aggregator = LoopAggregator(plan, StageTap().install, cheat.adjust)
    with collaborator_log():
        group = HonestCollaborators.start(workspace, FOUR, lambda name: None, adjust=updates.adjust)
        try:
            group.join(RUN_SECONDS)
        finally:
            group.stop()
            aggregator.stop()
    errors = {**group.errors, **({"aggregator": aggregator.error} if aggregator.error else {})}
    return TrainingRun(workspace, cheat, updates, round_log(workspace), errors)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def measure_training(run: TrainingRun) -> dict[str, Any]:
    """The attacker's reading (round 1's sum less round 2's) against the victim's update, and the noise in it."""
    sums_, updates = run.cheat.sums, run.updates.by_site
    others = sorted(set(FOUR) - {VICTIM})
    carried_out = (
        {1, 2} <= sums_.keys()
        and sorted(sums_[1][3]) == list(FOUR)
        and sorted(sums_[2][3]) == others
        and all(1 in updates.get(name, {}) for name in FOUR)
        and all(2 in updates.get(name, {}) for name in others)
        and 2 not in updates.get(VICTIM, {})
        and run.log.get(1, {}).get("model_sha256") != run.log.get(2, {}).get("model_sha256")
    )
    if not carried_out:
        return {"carried_out": False}
    victim = updates[VICTIM][1][0]
    read = sums_[1][0] - sums_[2][0]
    exact = np.sum([updates[name][1][0] for name in FOUR], axis=0) - np.sum(
        [updates[name][2][0] for name in others], axis=0
    )
    stds = [sums_[number][1] for number in (1, 2)]
    logged = [
        float(run.log[number].get("mean_update_noise_std", 0.0)) * float(run.log[number].get("total_weight", 0.0))
        for number in (1, 2)
    ]
    std = math.hypot(*stds)
    noise = read - exact
    return {
        "carried_out": True,
        "dimension": int(victim.size),
        "cosine": round(cosine(read, victim), 4),
        "relative_error": round(float(np.linalg.norm(read - victim) / np.linalg.norm(victim)), 4),
        "relative_error_raw": float(np.linalg.norm(read - victim) / np.linalg.norm(victim)),
        # Without the noise the reading would miss only by the other sites' fresh samples in round 2.
        "sampling_relative_error": round(float(np.linalg.norm(exact - victim) / np.linalg.norm(victim)), 4),
        "victim_rms": float(np.sqrt(np.mean(victim**2))),
        "noise_std_per_sum": [float(value) for value in stds],
        "noise_std_logged": logged,
        "std": std,
        "noise": error_figures(noise, std) if std > 0 else {"largest_abs": float(np.abs(noise).max())},
        "total_weight": [float(sums_[number][2]) for number in (1, 2)],
    }


def training_row(root: Path, book: RowBook) -> None:
    delta = float(TRAINING_PRIVACY["delta"])
    with book.row(
        f'noise, training differencing: [privacy] mode = "distributed" (epsilon 3 over the plan\'s 2 rounds, delta '
        f"1e-5; local_steps 1, batch_fraction {BATCH_FRACTION}, declared sizes, 64-bit words), dropouts allowed: round 1 "
        f"on model M with every site, round 2 on M + 1 ulp without {VICTIM}: round 1's decoded sum less round 2's "
        f"would be {VICTIM}'s update",
        "the difference carries the noise of two sums: its departure from the un-noised difference (the sites' "
        f"updates as they computed them) is within {list(NOISE_BAND)} x sqrt(s1^2 + s2^2), s the stated noise std "
        "per coordinate (mean_update_noise_std x total_weight in the round log), and the reading misses the "
        f"victim's update by more than without privacy (the control: the same plan and attack without [privacy], "
        "where only the other sites' fresh Poisson samples blur it; with full batches the reading is exact); "
        f"each site's ledger holds one train release per round it trained ({VICTIM} one)",
        OPERATOR,
    ) as row:
        attack = training_run(root / "private", private=True)
        control = training_run(root / "control", private=False)
        full = training_run(root / "full-batches", private=False, batch_fraction=1.0)
        noised, plain, exact = measure_training(attack), measure_training(control), measure_training(full)
        spent = ledger(attack.workspace, FOUR, delta)
        ledger_ok = all(
            spent[name]["releases"] == [("train", 1)] + ([] if name == VICTIM else [("train", 2)]) for name in FOUR
        )
        figures = noised.get("noise", {})
        stated = noised.get("noise_std_per_sum", [0.0, 0.0])
        logged_ok = noised.get("carried_out") and all(
            math.isclose(a, b, rel_tol=1e-6) for a, b in zip(stated, noised["noise_std_logged"], strict=True)
        )
        row.record(
            f"noised: stated noise std per coordinate {stated[0]:.4g} (round 1) and {stated[1]:.4g} (round 2; "
            f"mean_update_noise_std x total_weight in the round log: {noised.get('noise_std_logged')}), so "
            f"{noised.get('std', 0):.4g} on the difference, against a victim update of RMS "
            f"{noised.get('victim_rms', 0):.3g} per coordinate ({noised.get('dimension')} values); the noise in "
            f"the reading: {figures.get('rms_in_std')} std RMS, {figures.get('max_in_std')} std at most; the "
            f"reading against {VICTIM}'s update: cosine {noised.get('cosine')}, relative error "
            f"{noised.get('relative_error')} (the other sites' resampling alone: {noised.get('sampling_relative_error')}); "
            f"epsilon charged: { {name: entry['epsilon'] for name, entry in spent.items()} }; control without "
            f"[privacy]: cosine {plain.get('cosine')}, relative error {plain.get('relative_error')}; with full batches: "
            f"cosine {exact.get('cosine')}, relative error {exact.get('relative_error_raw')}",
            bool(noised.get("carried_out"))
            and bool(plain.get("carried_out"))
            and bool(logged_ok)
            and bool(exact.get("carried_out"))
            and stated[0] > 0.0
            and within(figures.get("rms_in_std"))
            and within(figures.get("max_over_expected"))
            and plain.get("noise_std_per_sum") == [0.0, 0.0]
            and noised["relative_error"] > plain["relative_error"]
            and exact["relative_error_raw"] < 1e-6
            and ledger_ok
            and all(entry["epsilon"] > 0.0 for entry in spent.values()),
            attack=noised,
            control=plain,
            full_batches=exact,
            ledger=spent,
            errors={
                **attack.errors,
                **{f"control {k}": v for k, v in control.errors.items()},
                **{f"full batches {k}": v for k, v in full.errors.items()},
            },
        )


# ---------------------------------------------------------------- the scenario


def noise_rows(root: Path, book: RowBook, *, quick: bool = False) -> None:
    """Every row of this module (see its notes); about 10 s on 2 cores, so `quick` leaves nothing out."""
    evaluation_rows(root / "evaluation", book)
    composition_row(root / "composition", book)
    training_row(root / "training", book)
