"""The statistics aggregation before round 1, for plans with a [schema]: one attempt, as a function.

One secure sum of every site's counts and sums (:mod:`fedfair.datasets.statistics`) gives the
encoder all sites share: exact, or under the plan's [privacy] report_epsilon noised inside the sum
(each site charged its ledger first), in which case the encoder is estimated from the noised sum.
:class:`~fedfair.runtime.aggregator.loop.RoundLoop` runs attempts (:func:`statistics_checkpoint`) until
one gives the encoder, which is saved at once with the initial model and told to the operator.
"""

from __future__ import annotations

import logging

import numpy as np

from fedfair.core.errors import ConfigError, RoundAbortedError, StatisticsError, StatisticsReason
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.statistics import (
    NOISED_STATISTICS_FRACTIONAL_BITS,
    encoder_from_noised_statistics,
    encoder_from_statistics,
    statistics_dimension,
)
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.aggregator.checkpoint import Checkpoint, save_checkpoint
from fedfair.runtime.aggregator.driver import SumDriver
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.contract import EVALUATION
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, plan_content, plan_digest
from fedfair.runtime.plan.privacy import decoded_noise_std, statistics_release
from fedfair.runtime.preprocessing import STATISTICS_KIND, STATISTICS_ROUND, statistics_encoding

logger = logging.getLogger("fedfair.aggregator")


def statistics_checkpoint(
    plan: AggregatorPlan, driver: SumDriver, participants: frozenset[str], events: EventLog
) -> Checkpoint:
    """One attempt, kept: round 0's checkpoint (the encoder and the initial model it gives), saved at once.

    Saved before round 1 so that a resumed run serves the same encoder; the operator's log and the event log
    say who contributed and, under [privacy] report_epsilon, the noise each count and sum carries.

    Raises StatisticsError: as :func:`statistics_encoder`.
    """
    encoder, contributors, noise_std = statistics_encoder(plan, driver, participants)
    logger.info(
        "statistics aggregation: %d rows from %s give %d features (%d classes)%s; every site encodes with them",
        encoder.rows,
        ", ".join(contributors),
        encoder.num_features,
        len(encoder.class_names),
        f", noised (standard deviation {noise_std:.3g} per count and sum, charged to each site)" if noise_std else "",
    )
    events.emit("statistics", contributors=contributors, rows=encoder.rows, features=encoder.num_features)
    checkpoint = Checkpoint(
        STATISTICS_ROUND,
        initial_state(plan, encoder),
        plan_digest(plan),
        encoder=encoder.to_mapping(),
        plan=plan_content(plan),
    )
    save_checkpoint(plan.aggregator.output, checkpoint)
    return checkpoint


def statistics_encoder(
    plan: AggregatorPlan, driver: SumDriver, participants: frozenset[str]
) -> tuple[Encoder, list[str], float]:
    """One attempt: the federation's encoder, who contributed to its sum, and the sum's noise standard deviation.

    The noise is 0 for exact statistics; under the plan's [privacy] report_epsilon it is each coordinate's
    standard deviation (real units) over the contributors' shares (:func:`statistics_release`).

    Raises StatisticsError: ABORTED when the aggregation aborted or named culprits (a later attempt
    may do better), NO_ENCODER when its sum gives no encoder (the same sites would give the same sum).
    """
    schema, noised = plan.schema, plan.privacy.noised
    assert schema is not None  # only a plan with a [schema] aggregates statistics
    nothing = (np.zeros(0), 0.0)  # no model is involved: the sites send what their tables hold
    noise_std = 0.0
    try:
        outcome = driver.run(
            STATISTICS_ROUND,
            EVALUATION,
            participants,
            statistics_dimension(schema, noised=noised),
            statistics_encoding(noised),
            nothing,
            kind=STATISTICS_KIND,
        )
        if outcome.culprits:
            raise RoundAbortedError("misbehaving collaborators", outcome.culprits)
        if noised:
            floor = plan.survivor_floor(len(plan.collaborators))
            release = statistics_release(plan.privacy, schema)
            colluders = driver.settings.security.max_colluding  # the round's own parameters, as every site's
            summands = len(outcome.contributors)
            noise_std = decoded_noise_std(release, floor, colluders, summands, NOISED_STATISTICS_FRACTIONAL_BITS)
            encoder = encoder_from_noised_statistics(schema, outcome.weighted_sum, noise_std)
        else:
            encoder = encoder_from_statistics(schema, outcome.weighted_sum)
    except RoundAbortedError as error:
        named = "".join(f"; {name} misbehaved ({why})" for name, why in sorted(error.culprits.items()))
        raise StatisticsError(
            StatisticsReason.ABORTED,
            f"the statistics aggregation before round 1 aborted: {error}{named}",
            error.culprits,
        ) from None
    except ConfigError as error:
        raise StatisticsError(
            StatisticsReason.NO_ENCODER,
            f"the statistics aggregation before round 1 failed: {error}. Nothing was trained or "
            "written; start the aggregator again (without --resume) once every collaborator runs",
        ) from None
    return encoder, list(outcome.contributors), noise_std
