"""The plan's ``[evaluation]``: how often, on which thresholds, and which columns describe the worst group."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedfair.core.errors import ConfigError
from fedfair.fairness import sums
from fedfair.fairness.tail import TailQuery
from fedfair.core.tables import Table, field_names, finite_number
from fedfair.runtime.plan.limits import MAX_ROUNDS, MAX_ROWS


@dataclass(frozen=True)
class EvaluationSettings:
    """Evaluate every N rounds (0: only after the last round), on thresholds the plan fixes.

    ``loss_range`` is where half of the evaluation's thresholds lie, evenly spaced
    (fedfair.fairness.sums): the same grid for every evaluation of the federation,
    computed by each side from its own copy of the plan; under [privacy] report_epsilon,
    its top is the cap the noised evaluation clips losses at (fedfair.fairness.tail). ``min_bucket_count`` is the
    fewest held-out samples a reported group risk may rest on. ``composition`` names
    [schema] columns the final evaluation describes the worst group by (empty: it does
    not; fedfair.runtime.composition_counts).
    """

    every: int = 0
    loss_range: tuple[float, float] = sums.LOSS_RANGE
    min_bucket_count: int = sums.MIN_BUCKET_COUNT
    composition: tuple[str, ...] = ()

    def due(self, round_number: int, rounds: int) -> bool:
        """Whether the plan evaluates after round `round_number` of `rounds`: every `every` rounds, and the last.

        Both sides ask it: the aggregator to schedule an evaluation, a collaborator to answer only those.
        """
        last = round_number == rounds
        return 1 <= round_number <= rounds and (last or (self.every > 0 and round_number % self.every == 0))

    def thresholds(self) -> np.ndarray:
        """The evaluation's thresholds (fedfair.fairness.sums.threshold_grid of the loss range)."""
        return sums.threshold_grid(self.loss_range)

    def tail_query(self) -> TailQuery:
        """The noised evaluation's query: tail sums of the losses clipped at the loss range's top."""
        return TailQuery(self.loss_range[1])


def read_evaluation(source: str, data: Mapping[str, object]) -> EvaluationSettings:
    """The plan's [evaluation] (defaults when absent); a ConfigError naming the key and the fix."""
    t = Table.of(source, data, "evaluation", field_names(EvaluationSettings))
    d = EvaluationSettings()
    loss_range = d.loss_range
    if t.given("loss_range"):
        value = t.data["loss_range"]
        expected = "a list of two numbers [low, high], e.g. [0.0, 3.0]"
        if not isinstance(value, list) or len(value) != 2 or not all(finite_number(x) for x in value):
            t.bad("loss_range", value, expected)
        try:
            loss_range = sums.check_loss_range((value[0], value[1]))
        except ConfigError as error:
            t.fail(f"[evaluation] loss_range: {error}")
    return EvaluationSettings(
        every=t.integer("every", d.every, low=0, high=MAX_ROUNDS),
        loss_range=loss_range,
        min_bucket_count=t.integer("min_bucket_count", d.min_bucket_count, low=1, high=MAX_ROWS),
        # An empty list is the default spelt out: no composition.
        composition=t.strings("composition") if t.data.get("composition") not in (None, []) else (),
    )
