"""An evaluation's figures from its decoded sum: one definition for the aggregator and every site.

The aggregator turns the federated evaluation's secure sum into its record (:mod:`fedfair.runtime.aggregator.
evaluation`); a site that verified the same sum turns it into the same figures with these functions
(:mod:`fedfair.runtime.collaborator.figures`). Both sides import this module; neither imports the other's. The
figures are the held-out risks with their bounds and, when counted, the worst group's composition: a function of
the decoded sum, the plan, the model's c and K, and the noise each decoded coordinate carries (:func:`noise_stds`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedfair.fairness import sums, tail
from fedfair.runtime.composition_counts import CompositionColumn, composition_from_sums
from fedfair.runtime.plan.learning_settings import LearningSettings
from fedfair.runtime.plan.privacy import answer_release, composition_release, decoded_noise_std


@dataclass(frozen=True)
class Earlier:
    """The first ask of the model the aggregator evaluated last: the model's digest, that round, its contributors.

    Each of them holds its answer on that model for good and sends it again. `contributors` None: not known (the
    evaluation aborted, or this process restarted since), so any site may hold one.
    """

    model: str
    round: int
    contributors: frozenset[str] | None


def evaluation_figures(
    settings: LearningSettings,
    round_number: int,
    summed: np.ndarray,
    c: float,
    sum_error: float,
    stds: tuple[float, float],
    classes: int | None,
) -> dict[str, Any]:
    """The figures of round `round_number`'s evaluation of a model of threshold `c` and `classes` classes.

    `summed` is the decoded weighted sum, `sum_error` its rounding bound, `stds` the noise on each risk
    coordinate and on each composition count (:func:`noise_stds`). Returns the report's fields and, when the
    round counts the composition, "composition" (with its epsilon under a noised plan).

    Raises:
        ConfigError: the sum gives no report (too few held-out samples, or counts no honest sites add up to).
    """
    noise_std, counts_std = stds
    if settings.privacy.noised:
        query = settings.evaluation.tail_query()
        risks = query.length
        rho = settings.objective.rho
        tails = tail.tail_report(
            query, summed[:risks], c, rho, noise_std=noise_std, sum_error=sum_error, classes=classes
        )
        report = tails.report(rho, noise_std, query.cap)
    else:
        risks = sums.vector_length()
        report = sums.report_from_sums(
            summed[:risks],
            settings.evaluation.thresholds(),
            settings.objective.rho,
            min_bucket_count=settings.evaluation.min_bucket_count,
            sum_error=sum_error,
        )
    figures: dict[str, Any] = report.to_dict()
    columns = settings.counted_columns(round_number)
    if columns:
        assert settings.schema is not None  # composition columns are refused without a [schema]
        composition = composition_from_sums(
            columns, summed[risks:], c, settings.schema.min_category_count, noise_std=counts_std
        )
        if settings.privacy.noised:
            composition["epsilon"] = answer_epsilon(settings, round_number)
        figures["composition"] = composition
    return figures


def answer_epsilon(settings: LearningSettings, round_number: int) -> float:
    """The epsilon each site's answer to the evaluation of `round_number` spends under a noised plan."""
    privacy = settings.privacy
    assert privacy.report_epsilon is not None  # only noised plans ask
    interim = privacy.interim_report_epsilon
    return privacy.report_epsilon if round_number == settings.training.rounds or interim is None else interim


def noise_stds(
    settings: LearningSettings,
    collaborators: int,
    round_number: int,
    columns: tuple[CompositionColumn, ...],
    contributors: Collection[str],
    repeated: Earlier | None,
) -> tuple[float, float]:
    """The noise standard deviation on each decoded risk coordinate and on each composition count.

    `collaborators` is the plan's roster size, `columns` the round's composition columns. A site that answered the `repeated` model at an earlier evaluation
    sends those kept words again (one answer per model) and, at the final round, the counts as their own release
    (:func:`~fedfair.runtime.plan.privacy.composition_release`); a site that did not answers afresh. Sites known
    to have contributed then carry the first; any other carries the larger of the two per part, so the stated
    noise never falls below the true one whichever it sent.
    """
    final = round_number == settings.training.rounds
    fresh = report_noise_std(settings, collaborators, columns, len(contributors), final=final)
    if repeated is None or not settings.privacy.noised or not contributors:
        return fresh, fresh
    known = len(set(contributors) & (repeated.contributors or frozenset()))
    unknown = len(contributors) - known
    floor, colluders = settings.survivor_floor(collaborators), settings.secure_aggregation.max_colluding
    kept_release = answer_release(settings.privacy, (), final=repeated.round == settings.training.rounds)
    kept = [decoded_noise_std(kept_release, floor, colluders, n) for n in (known, unknown)]
    unknown_fresh = report_noise_std(settings, collaborators, columns, unknown, final=final)
    risks = math.hypot(kept[0], max(kept[1], unknown_fresh))
    if not columns:
        return risks, 0.0
    alone = [
        decoded_noise_std(composition_release(settings.privacy, columns), floor, colluders, n) for n in (known, unknown)
    ]
    counts = math.hypot(alone[0], max(alone[1], unknown_fresh))
    return risks, counts


def report_noise_std(
    settings: LearningSettings,
    collaborators: int,
    columns: tuple[CompositionColumn, ...],
    summands: int,
    *,
    final: bool = True,
) -> float:
    """The noise standard deviation on each decoded coordinate of an evaluation summed over `summands` answers.

    `final`: the final evaluation's answers (report_epsilon), else an earlier one's (interim_report_epsilon).

    Under the plan's [privacy] (:mod:`fedfair.runtime.plan.privacy`) for a roster of `collaborators`; 0.0 for
    exact reports or no summands.
    """
    if not settings.privacy.noised or summands < 1:
        return 0.0
    floor = settings.survivor_floor(collaborators)
    release = answer_release(settings.privacy, columns, final=final)
    return decoded_noise_std(release, floor, settings.secure_aggregation.max_colluding, summands)
