"""What the aggregator decodes once the plan's ``[privacy]`` noises it (issue 41's acceptance rows).

Each row runs the pinned federation of :mod:`attacks.consent` (real collaborators in threads, mutual TLS
on loopback, ``dropouts = "allowed"``, the default) against fedfair's own aggregator, its round loop
patched (:class:`~attacks.consent.LoopAggregator`), and measures the decoded sums against the exact
ones, computed in-process from what each honest site computed before encoding (its seams wrapped: the
evaluation answers, the composition counts, the trained update). Each row states the noise scale the
aggregator faces (the ``noise_std`` it records itself) and the epsilon each site's ledger
(``NAME.FEDERATION.bindings.json``, ``"releases"``) charged, and is handled only when the error is of the
order of that noise (nothing exact), the ledger charged one release per fresh answer, and a control
without noise shows the attack exact (so the noise, not a broken harness, is what hides the answer):

- evaluation: the crafted logistic model of :func:`attacks.consent.crafted_state` (its losses inside the
  pinned grid) evaluated with every site under ``[privacy] report_epsilon = 1``: the decoded pooled
  histogram against the exact pooled one;
- 1-ulp difference: that model with every site (round 1), then the model one ulp away without one site
  (round 2, a fresh binding): the difference of the two decoded sums against that site's histogram;
- composition: a ``[schema]`` federation counting the worst group by a listed column, its final
  evaluation served with a c of the aggregator's choosing and then again with a second c: the counts
  follow each site's own c, the second query is refused, the counts (a cell and its complement) are
  noised, and without noise the sites suppress a small cell and its complement jointly;
- training differencing: ``[privacy] mode = "distributed"`` (epsilon 3 over the plan's rounds), round 1
  on model M with every site, round 2 on M + 1 ulp without the victim: the difference of the decoded sums
  against the victim's update (cosine, relative error), beside the same attack without privacy.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.cheating import collaborator_log
from attacks.consent import (
    AGE_FEATURE,
    FOUR,
    RUN_SECONDS,
    LoopAggregator,
    StageTap,
    crafted_state,
    fixed,
    lines_of,
    pinned_workspace,
    short,
)
from attacks.federation import HonestCollaborators
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.fairness import sums
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.record import InputRecord
from fedfair.runtime.contract import EVALUATION
from fedfair.runtime.plan import load_aggregator_plan
from fedfair.research.workspace import Workspace

FEDERATION_ID = "fedfair-launch"  # what make_workspace writes
VICTIM = FOUR[-1]
REPORT_PRIVACY = {"report_epsilon": 1.0, "budget": 10.0, "delta": 1e-5}
"""The evaluation rows' [privacy]: one answer spends epsilon 1 at delta 1e-5, within a budget of 10."""
NOISE_BAND = (0.3, 3.0)
"""A row's error must be within these multiples of the noise scale the aggregator states: of its order."""
OPERATOR = "cheating aggregator (fedfair's aggregator, its round loop patched) against real collaborators"


# ---------------------------------------------------------------- shared measurements


def bindings(workspace: Workspace, name: str) -> Path:
    return workspace.configs[name].parent / f"{name}.{FEDERATION_ID}.bindings.json"


def ledger(workspace: Workspace, names: tuple[str, ...], delta: float) -> dict[str, dict[str, Any]]:
    """Each site's ledger: its releases as (kind, round) and the epsilon they compose to at `delta`."""
    found: dict[str, dict[str, Any]] = {}
    for name in names:
        path = bindings(workspace, name)
        if not path.exists():
            found[name] = {"releases": [], "epsilon": 0.0}
            continue
        releases = json.loads(path.read_text()).get("releases", [])
        found[name] = {
            "releases": [(entry["kind"], int(entry["round"])) for entry in releases],
            "epsilon": round(InputRecord(path, FEDERATION_ID).spent(delta), 4),
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


def leaves(vector: np.ndarray) -> np.ndarray:
    """The histogram tree's leaf counts (the first K coordinates of an evaluation vector)."""
    return vector[: sums.THRESHOLDS]


# ---------------------------------------------------------------- evaluation and its 1-ulp difference


def one_ulp(state: Any) -> Any:
    """`state` with the evaluated model's weight on age one ulp up: another model digest, the same losses
    to within 1e-15, so the same answers but for the noise."""
    theta = state.theta_average.clone()
    theta[AGE_FEATURE] = float(np.nextafter(float(theta[AGE_FEATURE]), math.inf))
    return dataclasses.replace(state, theta=theta.clone(), theta_average=theta)


@dataclass
class UlpQuery:
    """The round loop replaced by two evaluations: the crafted model M in round 1 with every connected site,
    M + 1 ulp in round 2 without `leave_out` (consent.py's EvaluationQuery with its second model moved)."""

    leave_out: str
    done: threading.Event = field(default_factory=threading.Event)
    sums: dict[int, tuple[np.ndarray, tuple[str, ...]]] = field(default_factory=dict)
    results: dict[int, dict[str, Any]] = field(default_factory=dict)
    models: dict[int, float] = field(default_factory=dict)

    def adjust(self, loop: RoundLoop) -> None:
        run = loop.driver.run

        def recording(round_number: int, stages: Any, *args: Any, **options: Any) -> SumOutcome:
            outcome = run(round_number, stages, *args, **options)
            if stages is EVALUATION:
                self.sums[round_number] = (outcome.weighted_sum.copy(), outcome.contributors)
            return outcome

        def cheat() -> dict[str, Any]:
            try:
                assert loop._start is not None  # no [schema]: prepare() gives round 0's checkpoint
                crafted = crafted_state(loop._start.state)
                for round_number, left, state in ((1, None, crafted), (2, self.leave_out, one_ulp(crafted))):
                    loop.checkpoint = dataclasses.replace(loop._start, state=state)
                    self.models[round_number] = float(state.theta_average[AGE_FEATURE])
                    loop._participants(round_number, wait_for_everyone=True)
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
class Answers:
    """Each site's evaluation answers as it computed them, before encoding, noise and masking, in order."""

    by_site: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def adjust(self, name: str, collaborator: Collaborator) -> None:
        answer = collaborator._evaluation_answers

        def recorded(theta: torch.Tensor) -> np.ndarray:
            vector = answer(theta)
            self.by_site.setdefault(name, []).append(np.array(vector, dtype=np.float64))
            return vector

        collaborator._evaluation_answers = recorded  # type: ignore[method-assign]


@dataclass
class EvaluationRun:
    workspace: Workspace
    query: UlpQuery
    answers: Answers
    said: list[str]
    errors: dict[str, str]


def evaluation_run(root: Path, *, noised: bool) -> EvaluationRun:
    """The pinned four-site federation (min_round_size 3, dropouts allowed) against :class:`UlpQuery`, under
    REPORT_PRIVACY when `noised`, else with exact evaluation sums (the control)."""
    extra = {"privacy": REPORT_PRIVACY} if noised else {}
    workspace = pinned_workspace(root, quorum=3, rounds=2, **extra)
    plan = load_aggregator_plan(workspace.plan)
    query, answers = UlpQuery(VICTIM), Answers()
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
        victim_rows = int(leaves(victim).sum())
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
            # The tree's root node counts every held-out row: one coordinate, one noise draw.
            "rows_read": round(float(read[2 * sums.THRESHOLDS - 2]), 1),
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
            f"{sums.vector_length()} coordinates the error is {figures_all.get('rms_in_std')} std RMS, "
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
            and (figures_all.get("exact_share") or 1.0) < 0.5
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
            control_exact = control_largest < 1e-3 and bool(np.array_equal(np.rint(leaves(first - second)), leaves(victim)))
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
            f"tree's root {diff.get('rows_read')} (true {noised.victim_rows}); the others' answers on M and M + 1 ulp identical: "
            f"{diff.get('others_unchanged')}; epsilon spent: {spent} (two answers vs one); control without "
            f"[privacy]: largest error {control_largest}, every leaf count of {VICTIM} read exactly: {control_exact}",
            noised.carried_out
            and exact.carried_out
            and bool(diff.get("others_unchanged"))
            and within(against.get("rms_in_std"))
            and (against.get("exact_share") or 1.0) < 0.5
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


# ---------------------------------------------------------------- the scenario


def noise_rows(root: Path, book: RowBook, *, quick: bool = False) -> None:
    """Every row of this module (see its notes)."""
    evaluation_rows(root / "evaluation", book)
