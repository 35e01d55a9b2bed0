"""A site that missed a masked training round catches up: it checks that round's sum as its survivors did, then steps.

The masked round's catch-up (:mod:`fedfair.runtime.collaborator.catch_up`, registered by its name): the site checks
a kept round's parameters against its plan and the sum with :func:`fedfair.secagg.bystander.check_past_sum`, and
steps its chain by it. A forged past sum is refused as a survivor refuses one (VerificationError: the site stops).
docs/security.md, "Verified aggregation" (a site that missed a round).
"""

from __future__ import annotations

from fedfair.core.errors import ProtocolError, RefusedError, VerificationError, VerifyReason, WireError
from fedfair.runtime.collaborator.catch_up import KeptRound, KindCatchUp, register_catch_up
from fedfair.runtime.collaborator.steps import Participant
from fedfair.runtime.contract import TRAINING
from fedfair.runtime.state_files import HeldState
from fedfair.secagg.bystander import PastRound, check_past_sum
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.wire import Stage as SecAggStage

_KEPT = (
    SECURE_ROUND.sum_stages[0],  # its input: the round's parameters
    SECURE_ROUND.spec(SecAggStage.SHARE),
    SECURE_ROUND.spec(SecAggStage.CONSISTENCY),
    SECURE_ROUND.spec(SecAggStage.UNMASK),
    *SECURE_ROUND.verify_stages,
)
"""The masked round's stages whose inputs a bystander checks, in order (what the aggregator keeps of a round)."""


def masked_kept_round(me: Participant, round_number: int, inputs: list[bytes]) -> KeptRound:
    """Missed masked round `round_number`, its kept inputs (:data:`_KEPT`'s) parsed and its parameters checked.

    Raises:
        VerificationError: MALFORMED, the parameters differ from the plan or a message does not parse.
    """
    try:
        parameters = me.check_parameters_of(round_number, TRAINING, inputs[0])
        past = PastRound.parsed(inputs[1:])  # _KEPT's inputs after the parameters, in order
    except (ProtocolError, RefusedError, ValueError, WireError) as error:
        raise VerificationError(
            round_number, VerifyReason.MALFORMED, f"the kept inputs of the round it missed do not check: {error}"
        ) from None
    config = parameters.secagg_config(me.shared.federation_id, TRAINING)

    def step(state: HeldState) -> frozenset[str]:
        try:
            words = check_past_sum(past, config, me.verify)
        except VerificationError as error:  # named by the training round, as the model chain names its refusals
            raise VerificationError(round_number, error.reason, f"{error.detail} (a round it missed)") from None
        survivors = frozenset(config.name_of(party) for party in past.survivor_set.survivors)
        me.chain.caught_up(round_number, state, words, survivors, config.encoder)
        return survivors

    return KeptRound(parameters.model, step)


register_catch_up(SECURE_ROUND.name, KindCatchUp(_KEPT, masked_kept_round))
