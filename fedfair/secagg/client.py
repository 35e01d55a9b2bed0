"""A party's side of secure aggregation (Bonawitz et al. 2017, active-adversary variant, protocol v3).

:class:`Client` is a state machine over the messages of :mod:`fedfair.secagg.messages`, with no
I/O: ``advertise``, ``share_keys``, ``check_shares``, ``masked_input``, ``consistency`` and
``unmask``, in that order (the last two may be repeated), then in a verified round ``tag`` and
``verify`` (their checks: :mod:`fedfair.secagg.verify_client`). A step that receives a bad message
raises a :class:`~fedfair.core.errors.ProtocolError` subclass and leaves the state unchanged; a
peer's bad shares are accused, not raised. The checks by which a party keeps a lying server from
both secrets of one party are listed in docs/design.md ("Inside secure aggregation"). Its stages are
split by job: the key stages (:mod:`fedfair.secagg.keys_client`), the masking ones
(:mod:`fedfair.secagg.masking_client`) and the verifying ones (:mod:`fedfair.secagg.verify_client`), over the
state they share (:mod:`fedfair.secagg.client_state`).
"""

from __future__ import annotations

from fedfair.secagg.keys_client import KeyStages
from fedfair.secagg.masking_client import MaskingStages
from fedfair.secagg.verify_client import PLAIN_PIECE, VerifyStages

__all__ = ["PLAIN_PIECE", "Client"]


class Client(KeyStages, MaskingStages, VerifyStages):
    """One party's state for one round.

    config: the round's public parameters (the same at every party and the server).
    name: this party's roster name.
    identity_key: its ECDSA P-256 identity private key (the one its certificate certifies).
    credential: what peers verify that key with: its certificate (DER) or, without a PKI,
        its DER public key.
    verify_credential: turns a peer's name and relayed credential into its trusted public key.
    verified: keep a copy of the plain encoded input at MASK, so the party can tag and verify the aggregate
        in the VERIFY stage (:meth:`tag`, :meth:`verify`; one copy of the d + 1 words more). A caller that keeps those
        words itself leaves it False and hands them to ``tag`` instead.
    """
