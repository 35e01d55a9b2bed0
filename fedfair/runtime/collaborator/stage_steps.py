"""The step a collaborator runs at each upload stage, built from each secure round's declaration in its order.

A stage of a round's declaration runs its client's step (:func:`~fedfair.runtime.collaborator.steps.client_step`),
unless its kind of round registered a step of its own there (:data:`~fedfair.runtime.collaborator.steps.KIND_STEPS`):
the built-in kinds' in :mod:`~fedfair.runtime.collaborator.kinds`, which register them as they load.

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from fedfair.runtime.collaborator import kinds as kinds  # registers the built-in kinds' steps
from fedfair.runtime.collaborator.steps import KIND_STEPS, Step, client_step, kind_steps
from fedfair.runtime.contract import Stages
from fedfair.runtime.transport import WireStage


@functools.cache
def round_steps(stages: Stages) -> Mapping[WireStage, Step]:
    """The step a collaborator runs at each upload stage of an aggregation over `stages`, in the round's order.

    Its kind's own step where it registered one, else every kind's (:func:`~.steps.kind_steps`: start the client,
    hand in the contribution), else its client's step. Built once per aggregation: a kind registers its steps
    before its first round.
    """
    protocol = stages.protocol
    own = KIND_STEPS.get(protocol.name, kind_steps)(protocol)
    return {stages.wire(spec): own.get(spec) or client_step(spec) for spec in protocol.stages(True)}
