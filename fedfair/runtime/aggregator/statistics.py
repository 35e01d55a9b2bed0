"""The statistics aggregation before round 1, for plans with a [schema]: one attempt, as a function.

One secure sum of every site's counts and sums (:mod:`fedfair.datasets.statistics`) gives the
encoder all sites share. :class:`~fedfair.runtime.aggregator.loop.RoundLoop` runs an attempt
until one gives the encoder, saves it with the initial model, and tells the operator.
"""

from __future__ import annotations

import numpy as np

from fedfair.core.errors import ConfigError, RoundAbortedError, StatisticsError, StatisticsReason
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.schema import Schema
from fedfair.datasets.statistics import encoder_from_statistics, statistics_dimension
from fedfair.runtime.aggregator.driver import SumDriver
from fedfair.runtime.contract import EVALUATION
from fedfair.runtime.preprocessing import STATISTICS_ENCODING, STATISTICS_KIND, STATISTICS_ROUND


def statistics_encoder(schema: Schema, driver: SumDriver, participants: frozenset[str]) -> tuple[Encoder, list[str]]:
    """One attempt: the federation's encoder and who contributed to its sum.

    Raises StatisticsError: ABORTED when the aggregation aborted or named culprits (a later attempt
    may do better), NO_ENCODER when its sum gives no encoder (the same sites would give the same sum).
    """
    nothing = (np.zeros(0), 0.0)  # no model is involved: the sites send what their tables hold
    try:
        outcome = driver.run(
            STATISTICS_ROUND,
            EVALUATION,
            participants,
            statistics_dimension(schema),
            STATISTICS_ENCODING,
            nothing,
            kind=STATISTICS_KIND,
        )
        if outcome.culprits:
            raise RoundAbortedError("misbehaving collaborators", outcome.culprits)
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
    return encoder, list(outcome.contributors)
