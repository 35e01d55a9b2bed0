"""A site that missed a masked training round catches up: it checks that round's sum as its survivors did, then steps.

When the model chain (:mod:`fedfair.runtime.collaborator.chain`) cannot check the model it is sent, the site fetches
each round it missed that the aggregator kept (:mod:`fedfair.runtime.aggregator.past_rounds`), checks the round's
parameters against its plan and the sum with :func:`fedfair.secagg.bystander.check_past_sum`, and steps its chain by
it. A round not kept is taken as void (the chain then checks the model stands). A forged past sum is refused as a
survivor refuses one (VerificationError: the site stops). The masked round's catch-up, registered by its name
(:func:`~fedfair.runtime.collaborator.catch_up.register_catch_up`): a bounded round (two verifiers) is sat out. docs/security.md, "Verified aggregation" (a site that missed a round).
"""

from __future__ import annotations

import logging

import grpc

from fedfair.core.errors import ProtocolError, RefusedError, VerificationError, VerifyReason, WireError
from fedfair.runtime.collaborator.catch_up import register_catch_up
from fedfair.runtime.collaborator.steps import Participant
from fedfair.runtime.collaborator.uplink import RPC_SECONDS, Uplink, input_limit
from fedfair.runtime.contract import TRAINING, RoundParameters, aggregations
from fedfair.runtime.transport import Reassembler, assemble, make_binding, pb, pb_grpc
from fedfair.secagg.bystander import PastRound, check_past_sum
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.wire import Stage as SecAggStage

logger = logging.getLogger("fedfair.collaborator")

_KEPT = (
    SECURE_ROUND.sum_stages[0],  # its input: the round's parameters
    SECURE_ROUND.spec(SecAggStage.SHARE),
    SECURE_ROUND.spec(SecAggStage.CONSISTENCY),
    SECURE_ROUND.spec(SecAggStage.UNMASK),
    *SECURE_ROUND.verify_stages,
)
"""The masked round's stages whose inputs a bystander checks, in order (what the aggregator keeps of a round)."""


def masked_catch_up(me: Participant, uplink: Uplink, stub: pb_grpc.FederationStub, through: int) -> bool:
    """Check and apply every training round up to `through` that this site's chain missed; whether it applied any.

    Raises:
        VerificationError: a kept round's sum or parameters do not check (the aggregator forged them).
    """
    applied = False
    for round_number in me.chain.missed(through):
        inputs = _fetched(me, uplink, stub, round_number)
        if inputs is None:
            logger.info(
                "%s: round %d: the aggregator keeps no inputs of it (void, or too long ago); taken as void",
                me.name,
                round_number,
            )
            continue
        parameters, past = _parsed(me, round_number, inputs)
        config = parameters.secagg_config(me.shared.federation_id, TRAINING)
        try:
            words = check_past_sum(past, config, me.verify)
        except VerificationError as error:  # named by the training round, as the model chain names its refusals
            raise VerificationError(round_number, error.reason, f"{error.detail} (a round it missed)") from None
        survivors = frozenset(config.name_of(party) for party in past.survivor_set.survivors)
        me.chain.caught_up(round_number, words, survivors, config.encoder)
        logger.info(
            "%s: round %d: caught up: it took no part, checked the sum of %s and stepped its model by it",
            me.name,
            round_number,
            ", ".join(sorted(survivors)),
        )
        applied = True
    return applied


def _fetched(me: Participant, uplink: Uplink, stub: pb_grpc.FederationStub, round_number: int) -> list[bytes] | None:
    """The kept inputs of `round_number`'s stages (:data:`_KEPT`), or None where the aggregator kept none."""
    federation = aggregations(me.shared.secure_aggregation)
    inputs: list[bytes] = []
    for spec in _KEPT:
        binding = make_binding(me.shared.federation_id, round_number, TRAINING.wire(spec))
        task = pb.Task(binding=binding, action=pb.ACTION_RUN)
        limit = input_limit(task, federation, me.shared.collaborator_count, me.parameters, 0)
        request = pb.FetchRequest(binding=binding)
        uplink.count(round_number, request.ByteSize())
        assembler = Reassembler(limit)
        try:
            assemble(stub.Fetch(request, timeout=RPC_SECONDS), assembler, binding)
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise  # the connection's to retry, as any request's
            return None
        except WireError:
            return None
        inputs.append(bytes(assembler.take()))
    return inputs


def _parsed(me: Participant, round_number: int, inputs: list[bytes]) -> tuple[RoundParameters, PastRound]:
    """The round's parameters, checked against this site's plan as a participant checks them, and its messages.

    Raises:
        VerificationError: MALFORMED, the parameters differ from the plan or a message does not parse.
    """
    try:
        parameters = me.check_parameters_of(round_number, TRAINING, inputs[0])
        messages = [spec.received(data) for spec, data in zip(_KEPT[1:], inputs[1:], strict=True) if spec.received]
        return parameters, PastRound(*messages)
    except (ProtocolError, RefusedError, ValueError, WireError) as error:
        raise VerificationError(
            round_number, VerifyReason.MALFORMED, f"the kept inputs of the round it missed do not check: {error}"
        ) from None


register_catch_up(SECURE_ROUND.name, masked_catch_up)
