"""A site that missed a masked training round catches up: it checks that round's sum as its survivors did, then steps.

When the model chain (:mod:`fedfair.runtime.collaborator.chain`) cannot check the model it is sent, the site fetches
each round it missed that the aggregator kept (:mod:`fedfair.runtime.aggregator.past_rounds`), checks the round's
parameters against its plan and the sum with :func:`fedfair.secagg.bystander.check_past_sum`, and steps its chain by
it. Each kept round's parameters state the digest of the model it ran on, which every survivor signed (it enters
the session): the site steps only from a state of its own chain with that digest. A round not kept may be void (the
next kept round then ran on the model before it) or applied (then no state of the chain matches, and the site stops
catching up and sits out the models it cannot check, ``model-unchecked``): the signed digest decides, never the
aggregator's word, and no later sum is spliced onto a model that lacks a round. A forged past sum is refused as a
survivor refuses one (VerificationError: the site stops). The masked round's catch-up, registered by its name
(:func:`~fedfair.runtime.collaborator.catch_up.register_catch_up`): a bounded round (two verifiers) is sat out. docs/security.md, "Verified aggregation" (a site that missed a round).
"""

from __future__ import annotations

import logging

import grpc

from fedfair.core.errors import ProtocolError, RefusedError, VerificationError, VerifyReason, WireError
from fedfair.runtime.collaborator.catch_up import register_catch_up
from fedfair.runtime.collaborator.steps import Participant
from fedfair.runtime.peer.uplink import RPC_SECONDS, Uplink, input_limit
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
            # Void or applied: the next kept round's model decides (ran_on), as the chain decides the next model.
            logger.info(
                "%s: round %d: the aggregator keeps no inputs of it (void, or too long ago); the next model decides",
                me.name,
                round_number,
            )
            continue
        parameters, past = _parsed(me, round_number, inputs)
        state = me.chain.ran_on(round_number, parameters.model)
        if state is None:
            logger.warning(
                "%s: round %d: it ran on a model this site's chain did not make (a round before it that the "
                "aggregator does not keep applied), so this site cannot catch up on it; it sits out the models it "
                "cannot check",
                me.name,
                round_number,
            )
            return applied
        config = parameters.secagg_config(me.shared.federation_id, TRAINING)
        try:
            words = check_past_sum(past, config, me.verify)
        except VerificationError as error:  # named by the training round, as the model chain names its refusals
            raise VerificationError(round_number, error.reason, f"{error.detail} (a round it missed)") from None
        survivors = frozenset(config.name_of(party) for party in past.survivor_set.survivors)
        me.chain.caught_up(round_number, state, words, survivors, config.encoder)
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
                # The connection's to retry, as any request's; said here, as the retry names only the live round.
                logger.warning(
                    "%s: catching up: the fetch of round %d's kept %s input failed (%s): a kept round must arrive within "
                    "%g s, as any download; the live round that needed it is retried",
                    me.name,
                    round_number,
                    spec.wire,
                    error.code().name,
                    RPC_SECONDS,
                )
                raise
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
        return parameters, PastRound.parsed(inputs[1:])  # _KEPT's inputs after the parameters, in order
    except (ProtocolError, RefusedError, ValueError, WireError) as error:
        raise VerificationError(
            round_number, VerifyReason.MALFORMED, f"the kept inputs of the round it missed do not check: {error}"
        ) from None


register_catch_up(SECURE_ROUND.name, masked_catch_up)
