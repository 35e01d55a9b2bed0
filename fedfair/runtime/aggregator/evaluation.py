"""The federated evaluation of the output model (theta-bar, c-bar): one secure sum, then its report.

Every collaborator sends its histogram of held-out losses on the plan's fixed grid
(:mod:`fedfair.fairness.sums`) and, at the final round of a plan with ``[evaluation]
composition``, appends its counts of who is above c-bar by category
(:mod:`fedfair.runtime.composition_counts`). The vector's length is the plan's for that round
(:meth:`~fedfair.runtime.plan.learning_settings.LearningSettings.evaluation_length`), which every
collaborator checks against its own plan. This module runs the sum and turns it into the
evaluation's record: the held-out risks, certified, and the composition when counted.
A sum that gives no report (too few samples, broken sums) raises ConfigError, and an
aggregation that fails raises RoundAbortedError; the round loop records either as an aborted
evaluation.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from fedfair.runtime.logs import per_round
from fedfair.fairness import sums
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.driver import SumDriver
from fedfair.runtime.composition_counts import CompositionColumn, composition_from_sums
from fedfair.runtime.plan.privacy import answer_release, decoded_noise_std
from fedfair.runtime.contract import EVALUATION
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan

logger = logging.getLogger("fedfair.aggregator")


def federated_evaluation(
    plan: AggregatorPlan,
    driver: SumDriver,
    round_number: int,
    participants: frozenset[str],
    model: tuple[np.ndarray, float],
    start_input: bytes = b"",
) -> tuple[SumOutcome, dict[str, Any]]:
    """Evaluate `model` (theta-bar, c-bar) over `participants`' held-out data by one secure sum.

    Return the sum's outcome (its contributors and culprits) and the evaluation's record ("status": "done", the
    round, the number of contributors, the report's fields and, when counted, "composition").
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
    risks = sums.vector_length()
    columns = plan.counted_columns(round_number)
    noise_std = report_noise_std(plan, columns, len(outcome.contributors))
    report = sums.report_from_sums(
        outcome.weighted_sum[:risks],
        plan.evaluation.thresholds(),
        plan.objective.rho,
        min_bucket_count=plan.evaluation.min_bucket_count,
        sum_error=outcome.error_bound,
        noise_std=noise_std,
        loss_cap=plan.evaluation.loss_range[1],
    )
    result: dict[str, Any] = {
        "status": "done",
        "round": round_number,
        "collaborators": len(outcome.contributors),
        **report.to_dict(),
    }
    logger.info(
        "round %d evaluation (held-out, rho = %g): worst %.4f, mean %.4f, best %.4f, accuracy %.4f",
        round_number,
        report.rho,
        report.worst_risk,
        report.mean_risk,
        report.best_risk,
        report.accuracy,
        extra=per_round(round_number, plan.training.rounds, worst=report.worst_risk, mean=report.mean_risk),
    )
    if columns:
        assert plan.schema is not None  # composition columns are refused without a [schema]
        composition = composition_from_sums(
            columns, outcome.weighted_sum[risks:], model[1], plan.schema.min_category_count, noise_std=noise_std
        )
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


def report_noise_std(plan: AggregatorPlan, columns: tuple[CompositionColumn, ...], summands: int) -> float:
    """The noise standard deviation on each decoded coordinate of an evaluation summed over `summands` answers.

    Under the plan's [privacy] (:mod:`fedfair.runtime.plan.privacy`); 0.0 for exact reports or no summands.
    """
    if not plan.privacy.noised or summands < 1:
        return 0.0
    floor = plan.survivor_floor(len(plan.collaborators))
    return decoded_noise_std(
        answer_release(plan.privacy, columns), floor, plan.secure_aggregation.max_colluding, summands
    )
