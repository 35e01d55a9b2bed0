"""A site that missed verified training rounds catches up, where its training kind registered how (none: sits out).

When the model chain (:mod:`fedfair.runtime.collaborator.chain`) cannot check the model it is sent, the site asks
its training kind's catch-up (:func:`register_catch_up`) to check and step by each round it missed that the
aggregator kept (:mod:`fedfair.runtime.aggregator.past_rounds`): the masked round's checks the sum as a bystander
(:mod:`fedfair.runtime.collaborator.kinds.masked_catch_up`). docs/security.md, "Verified aggregation".
"""

from __future__ import annotations

from collections.abc import Callable

from fedfair.core.errors import ConfigError
from fedfair.runtime.collaborator.steps import Participant
from fedfair.runtime.peer.uplink import Uplink
from fedfair.runtime.transport import pb_grpc

CatchUp = Callable[[Participant, Uplink, pb_grpc.FederationStub, int], bool]
"""catch_up(site, uplink, stub, through): check and apply every training round up to `through` the site's chain
missed; whether it applied any (VerificationError: a kept round's sum or parameters do not check)."""

CATCH_UPS: dict[str, CatchUp] = {}
"""Each kind of round whose missed rounds a site can check (:attr:`~fedfair.secagg.round.SecureRound.name`) -> how."""


def register_catch_up(kind: str, catch_up: CatchUp) -> None:
    """Plug a kind's catch-up in: a site that missed rounds of `kind` checks and applies them with `catch_up`.

    Raises:
        ConfigError: `kind` registered its catch-up already.
    """
    if kind in CATCH_UPS:
        raise ConfigError(f"the round kind {kind!r} registered its catch-up already")
    CATCH_UPS[kind] = catch_up


def catch_up(me: Participant, uplink: Uplink, stub: pb_grpc.FederationStub, through: int) -> bool:
    """Check and apply every training round up to `through` this site's chain missed; whether it applied any.

    Its training kind's catch-up, where it registered one; a kind without one (the bounded sum) applies none.

    Raises:
        VerificationError: a kept round's sum or parameters do not check (the aggregator forged them).
    """
    kind_catch_up = CATCH_UPS.get(me.shared.secure_aggregation.training_kind)
    return kind_catch_up is not None and kind_catch_up(me, uplink, stub, through)
