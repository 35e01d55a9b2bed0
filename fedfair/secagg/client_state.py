"""A party's state for one secure-aggregation round, which the stages of :class:`~fedfair.secagg.client.Client` share.

Its fresh secrets, what it learnt of its peers, the view it signed, and the header it binds its messages to. The
round's order is its runner's (:class:`~fedfair.secagg.round.PartyOrder`). The stages themselves are in
:mod:`fedfair.secagg.keys_client`, :mod:`fedfair.secagg.masking_client` and :mod:`fedfair.secagg.verify_client`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.pki.identity import CredentialVerifier
from fedfair.secagg import keys
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.messages import (
    AdvertiseKeys,
    ConsistencySignature,
    UnmaskRequest,
    UnmaskResponse,
)
from fedfair.secagg.payloads import View
from fedfair.secagg.shares import SECRET_BYTES, Held
from fedfair.secagg.verify_messages import AggregateTag
from fedfair.secagg.wire import Header, Stage


@dataclass(frozen=True, eq=False)
class Tagged:
    """What a party keeps of the aggregate it tagged: to verify it, and to answer the same claim again."""

    digest: bytes
    """The claimed aggregate's digest (:func:`~fedfair.secagg.verify.aggregate_digest`), signed with the tag."""
    message: AggregateTag
    """The tag this party sent."""
    expected: tuple[int, ...]
    """The challenge's dots of the claimed aggregate: what the survivors' tags must sum to."""
    vector: np.ndarray
    """The claimed aggregate, as this party tagged it."""


class ClientState:
    """One party's state for one round, and the checks its stages share (the arguments are ``Client``'s).

    config: the round's public parameters (the same at every party and the server).
    name: this party's roster name.
    identity_key: its ECDSA P-256 identity private key (the one its certificate certifies).
    credential: what peers verify that key with: its certificate (DER) or, without a PKI,
        its DER public key.
    verify_credential: turns a peer's name and relayed credential into its trusted public key.
    verified: keep a copy of the plain encoded input at MASK, so the party can tag and verify the aggregate
        in the VERIFY stage (``tag``, ``verify``; one copy of the d + 1 words more). A caller that keeps those
        words itself leaves it False and hands them to ``tag`` instead.
    """

    def __init__(
        self,
        config: SecAggConfig,
        name: str,
        identity_key: ec.EllipticCurvePrivateKey,
        credential: bytes,
        verify_credential: CredentialVerifier,
        *,
        verified: bool = False,
    ) -> None:
        self.config = config
        self._verified = verified
        self._plain: np.ndarray | None = None
        self._tag_keys: dict[int, bytes] = {}
        self._tagged: Tagged | None = None
        self.party = config.party_id(name)
        self._identity_key = identity_key
        self._credential = credential
        self._verify_credential = verify_credential
        # Fresh secrets every round: nothing learnt in one round helps unmask another.
        self._cipher_key = keys.generate_key_pair()
        self._mask_key = keys.generate_key_pair()
        self._seed = os.urandom(SECRET_BYTES)
        self._advertisement: AdvertiseKeys | None = None
        self._directory: dict[int, AdvertiseKeys] = {}
        self._identities: dict[int, ec.EllipticCurvePublicKey] = {}
        self._session = b""
        self._share_keys: dict[int, bytes] = {}
        self._pair_keys: dict[int, bytes] = {}
        self._held: dict[int, Held] = {}
        self._accused: frozenset[int] = frozenset()
        self._masking_set: tuple[int, ...] | None = None
        self._signed: ConsistencySignature | None = None
        self._view: View | None = None
        self._input_digest = b""
        self._answered: tuple[UnmaskRequest, UnmaskResponse] | None = None
        self.excluded: dict[int, str] = {}
        """Peers whose advertisements were refused, with the reason; they take no part."""
        self.accusations: dict[int, str] = {}
        """Peers this party accused in its share check, with the reason."""

    @property
    def session_id(self) -> bytes:
        """The session id, known once the key directory is accepted (empty before)."""
        return self._session

    @property
    def signed_view(self) -> View | None:
        """The view (U2', U3, the survivors' masked-input digests) this party signed at CONSISTENCY, or None before."""
        return self._view

    def _header(self, stage: Stage) -> Header:
        return Header(
            self.config.federation_id, self.config.round, stage, b"" if stage is Stage.ADVERTISE else self._session
        )
