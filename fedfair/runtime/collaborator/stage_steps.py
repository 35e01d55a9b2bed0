"""The step a collaborator runs at each upload stage, built from each secure round's declaration in its order.

A stage of a round's declaration runs its client's step (:func:`~fedfair.runtime.collaborator.steps.client_step`),
unless the runtime adds to it: the masked round's steps are in :mod:`~fedfair.runtime.collaborator.steps`, the
bounded sum's in :mod:`~fedfair.runtime.collaborator.bounded_steps`.

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

from fedfair.runtime.collaborator import bounded_steps
from fedfair.runtime.collaborator.steps import (
    Step,
    advertise,
    client_step,
    consistency,
    masked,
    tag,
    verdict,
    verdicts_stage,
)
from fedfair.runtime.contract import BOUNDED_TRAINING, EVALUATION, TRAINING, Stages
from fedfair.runtime.transport import pb
from fedfair.secagg.bounded.stages import BOUNDED_ROUND
from fedfair.secagg.round import StageSpec
from fedfair.secagg.wire import Stage as SecAggStage


def round_steps(stages: Stages) -> dict[pb.Stage, Step]:
    """The step a collaborator runs at each upload stage of an aggregation over `stages`, in the round's order.

    A stage of the round's declaration runs its client's step, unless the runtime adds to it: the first checks
    the round's parameters and starts the client, masking encodes the contribution (or sends it plain), the
    survivors' signature is bound on disk first, and the verifying stages stop the site on a bad sum. In the
    bounded sum a site takes SHARE, DECIDE and VERIFY alone, each the runtime's own.
    """
    protocol = stages.protocol
    runtime: dict[StageSpec, Step]
    if protocol is BOUNDED_ROUND:
        runtime = {
            protocol.spec(protocol.contribution): bounded_steps.share,
            protocol.spec(protocol.committed): bounded_steps.decide,
            protocol.verify_stages[0]: bounded_steps.verify,
        }
    else:
        runtime = {
            protocol.sum_stages[0]: advertise,
            protocol.spec(SecAggStage.MASK): masked,
            protocol.spec(SecAggStage.CONSISTENCY): consistency,
        }
        if protocol.verify_stages:
            runtime[protocol.verify_stages[0]] = tag
            runtime[verdicts_stage(protocol)] = verdict
    return {stages.wire(spec): runtime.get(spec) or client_step(spec) for spec in protocol.stages(True)}


STEPS: dict[pb.Stage, Step] = {**round_steps(TRAINING), **round_steps(BOUNDED_TRAINING), **round_steps(EVALUATION)}
"""The step a collaborator runs at each upload stage of a training round (masked or bounded) and of an evaluation."""
