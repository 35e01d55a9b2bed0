"""A site that missed verified training rounds catches up, where its training kind registered how (none: sits out).

When the model chain cannot check the model it is sent, the site fetches each round it missed that the aggregator
kept (:mod:`fedfair.runtime.aggregator.past_rounds`), the inputs of the stages its kind's catch-up names
(:func:`register_catch_up`: :mod:`.kinds.masked_catch_up`, :mod:`.kinds.bounded_catch_up`), and steps its chain by
each once that kind's check passes. Each kept round's parameters state the digest of the model it ran on, signed by
its parties: the site steps only from a state of its own chain with that digest. A round not kept is void (the next
kept round ran on the model before it) or applied (no state matches: the site stops catching up and sits out the
models it cannot check, ``model-unchecked``): the signed digest decides, never the aggregator's word. A forged past
round is refused as a participant refuses one (VerificationError). docs/security.md, "Verified aggregation".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from fedfair.core.errors import ConfigError, WireError
from fedfair.runtime.collaborator.steps import Participant
from fedfair.runtime.contract import aggregations, training_stages
from fedfair.runtime.peer.uplink import RPC_SECONDS, Uplink, input_limit
from fedfair.runtime.state_files import HeldState
from fedfair.runtime.transport import Reassembler, assemble, make_binding, pb, pb_grpc
from fedfair.secagg.round import AnyStage

logger = logging.getLogger("fedfair.collaborator")


@dataclass(frozen=True)
class KeptRound:
    """A missed round's kept inputs, parsed and its parameters checked against the plan: what the site steps by.

    model: the digest of the model the round ran on, as its parameters state it (signed by its parties).
    step: checks the round's sum and, once it checks, steps the chain from the state the round ran on (the one of
        digest `model`); returns who is in the sum, or None where the sum checks but a site that missed the round
        cannot tell whether it was applied (it is then taken as a round not kept). Raises VerificationError, naming
        the missed round, where the sum does not check.
    """

    model: str
    step: Callable[[HeldState], frozenset[str] | None]


@dataclass(frozen=True)
class KindCatchUp:
    """How a site catches up on a missed round of one kind.

    kept: the training stages whose kept inputs it checks, in order (the aggregator keeps every input its parties
        were sent alike).
    parsed: (site, round number, those inputs) -> the :class:`KeptRound`; raises VerificationError (MALFORMED) where
        they do not parse or the parameters differ from the plan.
    """

    kept: tuple[AnyStage, ...]
    parsed: Callable[[Participant, int, list[bytes]], KeptRound]


CATCH_UPS: dict[str, KindCatchUp] = {}
"""Each kind of round whose missed rounds a site can check (:attr:`~fedfair.secagg.round.SecureRound.name`) -> how."""


def register_catch_up(kind: str, catch_up: KindCatchUp) -> None:
    """Plug a kind's catch-up in: a site that missed rounds of `kind` checks and applies them with `catch_up`.

    Raises:
        ConfigError: `kind` registered its catch-up already.
    """
    if kind in CATCH_UPS:
        raise ConfigError(f"the round kind {kind!r} registered its catch-up already")
    CATCH_UPS[kind] = catch_up


def catch_up(me: Participant, uplink: Uplink, stub: pb_grpc.FederationStub, through: int) -> bool:
    """Check and apply every training round up to `through` this site's chain missed; whether it applied any.

    Its training kind's catch-up, where it registered one; a kind without one applies none.

    Raises:
        VerificationError: a kept round's sum or parameters do not check (the aggregator forged them).
    """
    kind = CATCH_UPS.get(me.shared.secure_aggregation.training_kind)
    if kind is None:
        return False
    applied = False
    for round_number in me.chain.missed(through):
        inputs = kept_inputs(me, uplink, stub, round_number, kind.kept)
        if inputs is None:
            # Void or applied: the next kept round's model decides (ran_on), as the chain decides the next model.
            logger.info(
                "%s: round %d: the aggregator keeps no inputs of it (void, or too long ago); the next model decides",
                me.name,
                round_number,
            )
            continue
        kept = kind.parsed(me, round_number, inputs)
        state = me.chain.ran_on(round_number, kept.model)
        if state is None:
            logger.warning(
                "%s: round %d: it ran on a model this site's chain did not make (a round before it that the "
                "aggregator does not keep applied), so this site cannot catch up on it; it sits out the models it "
                "cannot check",
                me.name,
                round_number,
            )
            return applied
        summed = kept.step(state)
        if summed is None:
            continue  # void or applied, as a round not kept: the next kept round's model decides (its own log line)
        if me.name in summed and me.outcome is not None:
            # Its update is in the sum, by the round's signed data (it died after its part was committed): the
            # outcome record counts the round as one the model holds, as it would have had the site lived.
            me.outcome.held(round_number)
        logger.info(
            "%s: round %d: caught up: it took no part, checked the sum of %s and stepped its model by it",
            me.name,
            round_number,
            ", ".join(sorted(summed)),
        )
        applied = True
    return applied


def kept_inputs(
    me: Participant, uplink: Uplink, stub: pb_grpc.FederationStub, round_number: int, kept: tuple[AnyStage, ...]
) -> list[bytes] | None:
    """The kept inputs of `round_number`'s training stages `kept`, in order, or None where the aggregator kept none.

    Raises:
        grpc.RpcError: UNAVAILABLE or DEADLINE_EXCEEDED, the connection's to retry (said here, as the retry names
            only the live round).
    """
    federation = aggregations(me.shared.secure_aggregation)
    training = training_stages(me.shared.secure_aggregation)
    inputs: list[bytes] = []
    for spec in kept:
        binding = make_binding(me.shared.federation_id, round_number, training.wire(spec))
        task = pb.Task(binding=binding, action=pb.ACTION_RUN)
        limit = input_limit(task, federation, me.shared.collaborator_count, me.parameters, 0)
        request = pb.FetchRequest(binding=binding)
        uplink.count(round_number, request.ByteSize())
        assembler = Reassembler(limit)
        try:
            assemble(stub.Fetch(request, timeout=RPC_SECONDS), assembler, binding)
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
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
