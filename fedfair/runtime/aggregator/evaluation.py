"""The federated evaluation of the output model (theta-bar, c-bar): one secure sum, then its report.

Every collaborator sends its answers on its held-out losses: under [privacy] report_epsilon its layered tail
sums below the cap (:mod:`fedfair.fairness.tail`), else its loss histogram on the plan's fixed grid
(:mod:`fedfair.fairness.sums`); at the final round of a plan with ``[evaluation] composition`` it
appends its counts of who is above c-bar by category (:mod:`fedfair.runtime.composition_counts`).
The vector's length is the plan's for that round, which every collaborator checks against its own
plan. This module runs the sum and turns it into the evaluation's record: the held-out risks with
their bounds, and the composition when counted. A sum that gives no report raises ConfigError, and
an aggregation that fails RoundAbortedError; the round loop records either as an aborted evaluation.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from fedfair.fairness import sums
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.driver import SumDriver
from fedfair.runtime.contract import EVALUATION, model_digest
from fedfair.runtime.evaluation_figures import Earlier, answer_epsilon, evaluation_figures, noise_stds
from fedfair.runtime.observe.logs import per_round
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan
from fedfair.runtime.report import verdicts

logger = logging.getLogger("fedfair.aggregator")


def federated_evaluation(
    plan: AggregatorPlan,
    driver: SumDriver,
    round_number: int,
    participants: frozenset[str],
    model: tuple[np.ndarray, float],
    start_input: bytes = b"",
    classes: int | None = None,
    earlier: Earlier | None = None,
) -> tuple[SumOutcome, dict[str, Any]]:
    """Evaluate `model` (theta-bar, c-bar) over `participants`' held-out data by one secure sum.

    `classes` is the model's K, for the class-prior baseline of a noised report. `earlier`: the first ask of the
    model last evaluated, whose sites answer that model again with their kept words (:func:`noise_stds`). Return
    the sum's outcome (its contributors and culprits) and the evaluation's record ("status": "done", the round,
    the model's digest, "answers_of_round" when its risks are an earlier round's answers, the number of
    contributors, the report's fields, the epsilon of a noised answer and, when counted, "composition" with its
    own noise and epsilon).
    """
    outcome = driver.run(
        round_number,
        EVALUATION,
        participants,
        plan.evaluation_length(round_number),
        sums.ENCODING,
        model,
        start_input=start_input,
    )
    columns = plan.counted_columns(round_number)
    digest = model_digest(*model)
    repeated = earlier if earlier is not None and earlier.model == digest and earlier.round < round_number else None
    stds = noise_stds(plan, len(plan.collaborators), round_number, columns, outcome.contributors, repeated)
    figures = evaluation_figures(plan, round_number, outcome.weighted_sum, model[1], outcome.error_bound, stds, classes)
    composition = figures.pop("composition", None)
    result: dict[str, Any] = {
        "status": "done",
        "round": round_number,
        "model": digest,
        "collaborators": len(outcome.contributors),
        **figures,
    }
    if plan.privacy.noised:
        # A repeated model's risks are the kept answers', spent at that earlier evaluation's epsilon.
        result["report_epsilon"] = answer_epsilon(plan, round_number if repeated is None else repeated.round)
    if repeated is not None:
        result["answers_of_round"] = repeated.round
    logger.info(
        "round %d evaluation (held-out, rho = %g): %s",
        round_number,
        figures["rho"],
        verdicts.describe(result),
        extra=per_round(round_number, plan.training.rounds, note=verdicts.progress_note(result)),
    )
    if composition is not None:
        assert plan.schema is not None  # composition columns are refused without a [schema]
        result["composition"] = composition
        logger.info(
            "round %d worst-group composition (held-out loss above c = %.4f) by %s: %d counts suppressed "
            "(below min_category_count = %d)",
            round_number,
            model[1],
            ", ".join(column.name for column in columns),
            composition["suppressed"],
            plan.schema.min_category_count,
        )
    return outcome, result
