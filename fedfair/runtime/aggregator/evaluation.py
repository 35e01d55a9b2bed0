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
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedfair.runtime.observe.logs import per_round
from fedfair.fairness import sums, tail
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.driver import SumDriver
from fedfair.runtime.composition_counts import CompositionColumn, composition_from_sums
from fedfair.runtime.plan.privacy import answer_release, composition_release, decoded_noise_std
from fedfair.runtime.contract import EVALUATION, model_digest
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
    noise_std, counts_std = noise_stds(plan, round_number, columns, outcome.contributors, repeated)
    summed = outcome.weighted_sum
    if plan.privacy.noised:
        query = plan.evaluation.tail_query()
        risks = query.length
        figures = tail.tail_report(
            query,
            summed[:risks],
            model[1],
            plan.objective.rho,
            noise_std=noise_std,
            sum_error=outcome.error_bound,
            classes=classes,
        )
        report = figures.report(plan.objective.rho, noise_std, query.cap)
    else:
        risks = sums.vector_length()
        report = sums.report_from_sums(
            summed[:risks],
            plan.evaluation.thresholds(),
            plan.objective.rho,
            min_bucket_count=plan.evaluation.min_bucket_count,
            sum_error=outcome.error_bound,
        )
    result: dict[str, Any] = {
        "status": "done",
        "round": round_number,
        "model": digest,
        "collaborators": len(outcome.contributors),
        **report.to_dict(),
    }
    if plan.privacy.noised:
        # A repeated model's risks are the kept answers', spent at that earlier evaluation's epsilon.
        result["report_epsilon"] = answer_epsilon(plan, round_number if repeated is None else repeated.round)
    if repeated is not None:
        result["answers_of_round"] = repeated.round
    logger.info(
        "round %d evaluation (held-out, rho = %g): %s",
        round_number,
        report.rho,
        verdicts.describe(result),
        extra=per_round(round_number, plan.training.rounds, note=verdicts.progress_note(result)),
    )
    if columns:
        assert plan.schema is not None  # composition columns are refused without a [schema]
        composition = composition_from_sums(
            columns, outcome.weighted_sum[risks:], model[1], plan.schema.min_category_count, noise_std=counts_std
        )
        if plan.privacy.noised:
            composition["epsilon"] = answer_epsilon(plan, round_number)
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


def answer_epsilon(plan: AggregatorPlan, round_number: int) -> float:
    """The epsilon each site's answer to the evaluation of `round_number` spends under a noised plan."""
    privacy = plan.privacy
    assert privacy.report_epsilon is not None  # only noised plans ask
    interim = privacy.interim_report_epsilon
    return privacy.report_epsilon if round_number == plan.training.rounds or interim is None else interim


@dataclass(frozen=True)
class Earlier:
    """The first ask of the model the aggregator evaluated last: the model's digest, that round, its contributors.

    Each of them holds its answer on that model for good and sends it again. `contributors` None: not known (the
    evaluation aborted, or this process restarted since), so any site may hold one.
    """

    model: str
    round: int
    contributors: frozenset[str] | None


def noise_stds(
    plan: AggregatorPlan,
    round_number: int,
    columns: tuple[CompositionColumn, ...],
    contributors: Sequence[str],
    repeated: Earlier | None,
) -> tuple[float, float]:
    """The noise standard deviation on each decoded risk coordinate and on each composition count.

    A site that answered the `repeated` model at an earlier evaluation sends those kept words again (one answer
    per model) and, at the final round, the counts as their own release
    (:func:`~fedfair.runtime.plan.privacy.composition_release`); a site that did not answers afresh. Sites known
    to have contributed then carry the first; any other carries the larger of the two per part, so the stated
    noise never falls below the true one whichever it sent.
    """
    final = round_number == plan.training.rounds
    fresh = report_noise_std(plan, columns, len(contributors), final=final)
    if repeated is None or not plan.privacy.noised or not contributors:
        return fresh, fresh
    known = len(set(contributors) & (repeated.contributors or frozenset()))
    unknown = len(contributors) - known
    floor, colluders = plan.survivor_floor(len(plan.collaborators)), plan.secure_aggregation.max_colluding
    kept_release = answer_release(plan.privacy, (), final=repeated.round == plan.training.rounds)
    kept = [decoded_noise_std(kept_release, floor, colluders, n) for n in (known, unknown)]
    risks = math.hypot(kept[0], max(kept[1], report_noise_std(plan, columns, unknown, final=final)))
    if not columns:
        return risks, 0.0
    alone = [
        decoded_noise_std(composition_release(plan.privacy, columns), floor, colluders, n) for n in (known, unknown)
    ]
    counts = math.hypot(alone[0], max(alone[1], report_noise_std(plan, columns, unknown, final=final)))
    return risks, counts


def report_noise_std(
    plan: AggregatorPlan, columns: tuple[CompositionColumn, ...], summands: int, *, final: bool = True
) -> float:
    """The noise standard deviation on each decoded coordinate of an evaluation summed over `summands` answers.

    `final`: the final evaluation's answers (report_epsilon), else an earlier one's (interim_report_epsilon).

    Under the plan's [privacy] (:mod:`fedfair.runtime.plan.privacy`); 0.0 for exact reports or no summands.
    """
    if not plan.privacy.noised or summands < 1:
        return 0.0
    floor = plan.survivor_floor(len(plan.collaborators))
    return decoded_noise_std(
        answer_release(plan.privacy, columns, final=final), floor, plan.secure_aggregation.max_colluding, summands
    )
