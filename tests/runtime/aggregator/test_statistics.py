"""One statistics aggregation: which failures a later attempt may heal, and which it may not.

The attempts over a live federation (collaborators that withdraw, die and come back) are in
`test_statistics_retry.py`; here each outcome of the sum is mapped to its error on its own.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from fedfair.core.errors import RoundAbortedError, StatisticsError, StatisticsReason
from fedfair.datasets.schema import Column, Schema
from fedfair.runtime.aggregator.driver import SumDriver
from fedfair.runtime.aggregator.statistics import statistics_encoder
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan
from fedfair.runtime.plan.privacy import PlanPrivacy

SCHEMA = Schema("y", ("no", "yes"), (Column("age", "numeric"),))
PLAN = cast(AggregatorPlan, SimpleNamespace(schema=SCHEMA, privacy=PlanPrivacy()))
"""What the statistics aggregation reads of a plan: its schema and (exact) privacy."""


class Outcome:
    """What SumDriver.run returns, as far as the statistics aggregation reads it."""

    def __init__(self, weighted_sum: np.ndarray, culprits: dict[str, str]) -> None:
        self.weighted_sum, self.culprits, self.contributors = weighted_sum, culprits, ("a", "b")


def driver(result: Any) -> SumDriver:
    """A driver whose one aggregation gives `result` (an Outcome) or raises it (an exception)."""

    class OneSum:
        def run(self, *args: Any, **kwargs: Any) -> Any:
            if isinstance(result, Exception):
                raise result
            return result

    return cast(SumDriver, OneSum())


def test_an_abort_and_named_culprits_may_heal_a_sum_without_an_encoder_may_not() -> None:
    with pytest.raises(StatisticsError, match="aborted: only 1 of 3 parties advertised keys") as aborted:
        statistics_encoder(PLAN, driver(RoundAbortedError("only 1 of 3 parties advertised keys")), frozenset("abc"))
    assert aborted.value.reason is StatisticsReason.ABORTED and aborted.value.culprits == {}
    named = Outcome(np.zeros(8), {"c": "a bad share"})
    with pytest.raises(StatisticsError, match=r"c misbehaved \(a bad share\)") as culprits:
        statistics_encoder(PLAN, driver(named), frozenset("abc"))
    assert culprits.value.reason is StatisticsReason.ABORTED and culprits.value.culprits == {"c": "a bad share"}
    empty = Outcome(np.zeros(0), {})  # a sum of the wrong length: no encoder, whoever sends it
    with pytest.raises(StatisticsError, match="failed: .*start the aggregator again") as failed:
        statistics_encoder(PLAN, driver(empty), frozenset("ab"))
    assert failed.value.reason is StatisticsReason.NO_ENCODER
