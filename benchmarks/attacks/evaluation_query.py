"""The review's evaluation query: a crafted model evaluated on a grid of the aggregator's choosing, and twice.

A row of the consent scenario (:mod:`attacks.consent`), over its pinned federation (:mod:`attacks.pinned_federation`):
the review's crafted logistic model (10 on age, bias 40), evaluated under a served plan with
``loss_range = [20, 80]`` (refused: plan-mismatch), and under the pinned plan twice, the second time without one
site. Under secure aggregation no site evaluates a model its chain did not make (issue 79): every site sits both
out, nothing is decoded.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.cheating import collaborator_log
from attacks.federation import HonestCollaborators
from attacks.pinned_federation import (
    FOUR,
    RUN_SECONDS,
    LoopAggregator,
    StageTap,
    lines_of,
    fixed,
    pinned_workspace,
    served_differences,
    short,
)
from attacks.rows import RowBook
from fedfair.core import server
from fedfair.fairness import sums
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.contract import EVALUATION, model_digest, model_download
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, load_aggregator_plan


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
