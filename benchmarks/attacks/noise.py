"""What the aggregator decodes once the plan's ``[privacy]`` noises it (issue 41's acceptance rows).

Each row runs the pinned federation of :mod:`attacks.pinned_federation` (real collaborators in threads, mutual TLS on
loopback, ``dropouts = "allowed"``) against fedfair's own aggregator, its round loop patched, and measures the decoded
sums against the exact ones each honest site computed before encoding, in units of the noise the aggregator states,
with the epsilon each site's ledger charged, beside a control without noise (:mod:`attacks.noise_figures`):

- evaluation: the crafted model of :func:`attacks.evaluation_query.crafted_state` with every site: the pooled histogram;
- 1-ulp difference: that model with every site, then one ulp away without one: that site's histogram. Since issue 79
  no site evaluates a model its chain did not make, so both are sat out by every site and nothing is decoded: the
  rows take that as handled (the attack refused outright), and measure the noise only where an answer comes;
- composition and training differencing (:mod:`attacks.noise_composition`, :mod:`attacks.noise_training`): where
  the aggregator forges a model, every site refuses it (verified aggregation); curious only, the noise hides.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.cheating import collaborator_log
from attacks.evaluation_query import AGE_FEATURE, EvaluationQuery
from attacks.pinned_federation import (
    FOUR,
    RUN_SECONDS,
    LoopAggregator,
    StageTap,
    fixed,
    lines_of,
    pinned_workspace,
    short,
)
from attacks.federation import HonestCollaborators, wire_ulp_up
from attacks.noise_figures import NOISE_BAND, OPERATOR, REPORT_PRIVACY, VICTIM, error_figures, ledger, unexact, within
from attacks.noise_composition import composition_row
from attacks.noise_training import training_row
from attacks.own_ledgers import federation_ledgers
from attacks.rows import RowBook
from fedfair.fairness import sums, tail
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.local.workspace import Workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

# ---------------------------------------------------------------- evaluation and its 1-ulp difference


def leaves(vector: np.ndarray) -> np.ndarray:
    """The histogram tree's leaf counts (the first K coordinates of an exact evaluation vector; all of a noised
    answer's few tail sums)."""
    return vector[: sums.THRESHOLDS]


def rows_of(vector: np.ndarray) -> float:
    """The held-out rows an evaluation vector counts: the exact tree's root, or a noised answer's row count."""
    if vector.size == sums.vector_length():
        return float(vector[2 * sums.THRESHOLDS - 2])
    return float(vector[0]) / float(tail.TailQuery(1.0).weights()[0])


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
        answer = collaborator.evaluation_answers

        def recorded(theta: torch.Tensor, c: float) -> np.ndarray:
            vector = answer(theta, c)
            self.by_site.setdefault(name, []).append(np.array(vector, dtype=np.float64))
            return vector

        collaborator.evaluation_answers = recorded  # type: ignore[method-assign]


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
    with collaborator_log() as said, federation_ledgers(workspace):
        group = HonestCollaborators.start(workspace, FOUR, fixed, adjust=answers.adjust)
        try:
            query.done.wait(RUN_SECONDS)
        finally:
            group.stop()
            aggregator.stop()
    errors = {**group.errors, **({"aggregator": aggregator.error} if aggregator.error else {})}
    return EvaluationRun(workspace, query, answers, said, errors)


def sat_out(run: EvaluationRun) -> bool:
    """Whether every site sat the crafted model out (it is no model its chain made: issue 79) and nothing was decoded."""
    return not run.query.sums and all(lines_of(run.said, name, "cannot check the model it was sent") for name in FOUR)


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
        "every site sits the crafted model out (no model its chain made: issue 79): nothing is decoded, no site's "
        "ledger is charged, nor in the control; were it answered, the decoded pooled histogram would differ from "
        "the exact one (the sites' own answers, summed in-process) by the noise the aggregator states:"
        f" RMS error within {list(NOISE_BAND)} x its noise_std, the largest "
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
        refused = (
            sat_out(runs["noised"])
            and sat_out(runs["exact"])
            and not any(entry["releases"] for entry in noised.ledger.values())
        )
        row.record(
            f"every site sat the crafted model out, nothing decoded or charged: {refused}; "
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
            and control_error < 1e-3
            or refused,
            refused_outright=refused,
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
        "every site sits both crafted models out (no model its chain made: issue 79): nothing is decoded, no "
        "site's ledger is charged, nor in the control; were they answered, the difference would miss the victim's "
        "histogram by the noise of two sums (std sqrt(s1^2 + s2^2) from the "
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
        refused = sat_out(runs["noised"]) and sat_out(runs["exact"]) and not any(spent.values())
        row.record(
            f"every site sat both crafted models out, nothing decoded or charged: {refused}; "
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
            and control_exact
            or refused,
            refused_outright=refused,
            noise_std=diff.get("std"),
            difference=diff,
            control=exact.difference,
            control_largest_error=control_largest,
            epsilon=spent,
            refusals=[short(line, 200) for line in runs["noised"].said if "refus" in line][:4],
        )


# ---------------------------------------------------------------- the scenario


def noise_rows(root: Path, book: RowBook, *, quick: bool = False) -> None:
    """Every row of this scenario (see the notes above); about 15 s on 2 cores, so `quick` leaves nothing out."""
    evaluation_rows(root / "evaluation", book)
    composition_row(root / "composition", book)
    training_row(root / "training", book)
