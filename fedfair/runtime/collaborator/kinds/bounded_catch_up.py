"""A site that missed a bounded training round catches up: it checks the round's verdict record and tags, then steps.

The bounded sum's catch-up (:mod:`fedfair.runtime.collaborator.catch_up`, registered by its name): the site fetches
the round's kept SHARE opening (the round's parameters, with every relayed certificate, and the auditor's signed
round key), its verdict record and its tag set; checks the parameters against its plan and each certificate against
its manifest's pins, as it would have at SHARE (:func:`~fedfair.runtime.collaborator.kinds.bounded.site_setup`);
checks the record and every accepted site's and the auditor's signed tags against the record's total as an accepted
site checks them (:func:`fedfair.secagg.bounded.bystander.check_past_total`, which states why that is sound up to
``max_colluding``), and sits out, as a round not kept, one whose record names a liar (a dispute may have voided it,
:class:`~fedfair.core.errors.VoidableRoundError`); keeps the record's bytes beside its config, as a participant does; and applies the public
server step to the total itself. A record or tags that do not check are refused as a participant refuses them
(VerificationError: the site stops). docs/security.md, "A site that missed a bounded round".
"""

from __future__ import annotations

import logging

from fedfair.core.errors import (
    ConfigError,
    ProtocolError,
    RefusedError,
    VerificationError,
    VerifyReason,
    VoidableRoundError,
    WireError,
)
from fedfair.runtime.collaborator.catch_up import KeptRound, KindCatchUp, register_catch_up
from fedfair.runtime.collaborator.kinds.bounded import keep_record, site_setup
from fedfair.runtime.collaborator.steps import Participant
from fedfair.runtime.contract import training_of
from fedfair.runtime.state_files import HeldState
from fedfair.secagg.bounded.bystander import PastBoundedRound, check_past_total
from fedfair.secagg.bounded.parameters import round_parameters
from fedfair.secagg.bounded.stages import BOUNDED_ROUND, DECIDE_STAGE, SHARE_STAGE, VERIFY_STAGE

logger = logging.getLogger("fedfair.collaborator")

_KEPT = (SHARE_STAGE, DECIDE_STAGE, VERIFY_STAGE)
"""The bounded round's stages whose inputs a bystander checks, in :meth:`PastBoundedRound.parsed`'s order."""

_TRAINING = training_of(BOUNDED_ROUND)


def bounded_kept_round(me: Participant, round_number: int, inputs: list[bytes]) -> KeptRound:
    """Missed bounded round `round_number`, its kept inputs (:data:`_KEPT`'s) parsed and its parameters checked.

    Raises:
        VerificationError: MALFORMED, a message does not parse, the parameters differ from the plan, or a relayed
            certificate is not the one the manifest pins.
    """
    try:
        past = PastBoundedRound.parsed(inputs)
        parameters = me.check_parameters_of(round_number, _TRAINING, past.opening.public)
        config = parameters.secagg_config(me.shared.federation_id, _TRAINING)
        bounded = round_parameters(config, site_setup(me, parameters))
    except (ConfigError, ProtocolError, RefusedError, ValueError, WireError) as error:
        raise VerificationError(
            round_number, VerifyReason.MALFORMED, f"the kept inputs of the round it missed do not check: {error}"
        ) from None

    def step(state: HeldState) -> frozenset[str] | None:
        try:
            checked = check_past_total(past, bounded)
        except VerificationError as error:  # named by the training round, as the model chain names its refusals
            raise VerificationError(round_number, error.reason, f"{error.detail} (a round it missed)") from None
        except VoidableRoundError as voidable:
            logger.warning(
                "%s: caught up to round %d but not applying it: %s; the next round's model decides whether it was",
                me.name,
                round_number,
                voidable,
            )
            return None
        kept = keep_record(me, round_number, inputs[_KEPT.index(DECIDE_STAGE)])
        accepted = frozenset(config.name_of(party) for party in checked.findings.accepted)
        for party, reasons in sorted(checked.findings.liars.items()):
            logger.warning(
                "%s: round %d (missed): the verdict record names %s: its proof failed (%s); it is not in the sum%s",
                me.name,
                round_number,
                config.name_of(party),
                "; ".join(reasons),
                "" if kept is None else f" (kept as {kept})",
            )
        me.chain.caught_up_fixed_point(round_number, state, checked.total, accepted, bounded.fractional_bits)
        return accepted

    return KeptRound(parameters.model, step)


register_catch_up(BOUNDED_ROUND.name, KindCatchUp(_KEPT, bounded_kept_round))
