"""What this institution answers an evaluation: sums over its held-out losses under a model, and who is above c.

The answers are computed from its prepared data and the shared plan alone, apart from the round job that
downloads the model, keeps and encodes the answer (:mod:`fedfair.runtime.collaborator.rounds`): exact
threshold sums on its own copy of the plan's grid, so the aggregator cannot choose the thresholds; under
[privacy] report_epsilon its layered tail sums (:mod:`fedfair.fairness.tail`); and, at the final round of a
plan with ``[evaluation] composition``, its counts by category (:mod:`fedfair.runtime.composition_counts`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fedfair.core.evaluation import evaluate
from fedfair.fairness import sums, tail
from fedfair.runtime.collaborator.preparation import Prepared
from fedfair.runtime.composition_counts import CompositionColumn, local_counts
from fedfair.runtime.plan.aggregator_plan import SharedSettings


def evaluation_answers(prepared: Prepared, shared: SharedSettings, theta: torch.Tensor, c: float) -> np.ndarray:
    """This institution's answers to the evaluation's queries on its held-out losses under the model (theta, c).

    Exact reports: the threshold sums on its own copy of the plan's grid, so the aggregator cannot
    choose the thresholds. Under [privacy] report_epsilon: its layered tail sums, c one of their boundaries
    (:mod:`fedfair.fairness.tail`).
    """
    data, model = prepared.data, prepared.evaluation_model
    assert data is not None and model is not None  # a Prepared without them evaluates elsewhere
    result = evaluate(model, theta, data.test)
    errors = 1.0 - result.correct
    if shared.privacy.noised:
        labels = data.test.labels.numpy()
        return tail.tail_answers(shared.evaluation.tail_query(), result.losses, errors, labels, c)
    return sums.local_answers(result.losses, errors, shared.evaluation.thresholds())


def composition_counts(
    prepared: Prepared, shared: SharedSettings, theta: torch.Tensor, c: float, columns: Sequence[CompositionColumn]
) -> np.ndarray:
    """This institution's counts, per category of `columns`, of its held-out rows with loss above c, and of all.

    Suppressed jointly by the schema's small-cell rule (:func:`fedfair.runtime.composition_counts.local_counts`).
    c is the evaluated model's c-bar, which the aggregator's record states, so a site that missed rounds counts
    where the others do; the aggregator names every training c anyway, and a site answers the final evaluation
    once. The losses are computed again: the seam `Collaborator.evaluation_answers` returns the answers alone.
    """
    data, model, schema = prepared.data, prepared.evaluation_model, shared.schema
    # Composition columns need a [schema] (settings), whose encoding kept the held-out levels.
    assert data is not None and data.held_out_levels is not None and model is not None and schema is not None
    losses = evaluate(model, theta, data.test).losses
    # Under noise the counts go whole (a site's suppression would void their sensitivity); the small-cell
    # rule is applied to the noised sum instead, which costs no privacy.
    minimum = 1 if shared.privacy.noised else schema.min_category_count
    return local_counts(columns, data.held_out_levels, losses, c, minimum)
