"""Who advertised: a peer's advertisement checked under its identity, and credentials verified once.

:func:`verify_advertisement` is what both a party and the server check of every
advertisement; :class:`RememberedVerifier` keeps the (name, credential) pairs that passed,
so each certificate is checked in full once rather than by every party every round.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import AuthenticationError, IdentityError, ProtocolError
from fedfair.pki.identity import CredentialVerifier, is_valid_signature
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.messages import AdvertiseKeys
from fedfair.secagg.payloads import advertisement_payload
from fedfair.secagg.wire import check_header


def verify_advertisement(
    advertisement: AdvertiseKeys, config: SecAggConfig, verify_credential: CredentialVerifier
) -> ec.EllipticCurvePublicKey:
    """Check that an advertisement is for this round and signed by the roster party it names.

    Whether the X25519 keys are usable is the caller's check: the server probes them
    (:func:`keys.check_public_key`), a party agrees with them.

    Returns:
        The party's verified identity public key.

    Raises:
        StaleMessageError: the advertisement is for another round.
        ProtocolError: the party is outside the roster, or the commitment is malformed.
        AuthenticationError: the credential or the signature does not verify (a forged or swapped key).
    """
    identity = advertised_identity(advertisement, config, verify_credential)
    payload = advertisement_payload(
        config.digest,
        advertisement.sender,
        advertisement.cipher_public_key,
        advertisement.mask_public_key,
        advertisement.seed_commitment,
    )
    if not is_valid_signature(identity, advertisement.signature, payload):
        raise AuthenticationError(
            f"party {advertisement.sender}'s advertised keys do not match its signature (forged or swapped keys)"
        )
    return identity


def advertised_identity(
    advertisement: AdvertiseKeys, config: SecAggConfig, verify_credential: CredentialVerifier
) -> ec.EllipticCurvePublicKey:
    """The identity key of an advertisement's sender, from its credential alone (the keys are not checked).

    Enough for a party that will never use the sender's keys, a non-neighbour on a SecAgg+
    graph, but whose consistency signature it may count. Raises as :func:`verify_advertisement`.
    """
    check_header(advertisement, config, b"")
    if not config.is_party(advertisement.sender):
        raise ProtocolError(f"advertisement names party {advertisement.sender}, which is not in the roster")
    if len(advertisement.seed_commitment) != 32:
        raise ProtocolError(f"party {advertisement.sender}'s seed commitment is not 32 bytes")
    try:
        return verify_credential(config.name_of(advertisement.sender), advertisement.credential)
    except IdentityError as error:
        raise AuthenticationError(f"party {advertisement.sender}'s credential is not trusted: {error}") from None


REMEMBERED_CREDENTIALS = 1024
"""How many verified (name, credential) pairs a :class:`RememberedVerifier` keeps (oldest forgotten first)."""


@dataclass(frozen=True)
class _Trusted:
    """A credential that verified for a name: its public key and, for a certificate, its validity window."""

    public_key: ec.EllipticCurvePublicKey
    window: tuple[dt.datetime, dt.datetime] | None


class RememberedVerifier:
    """A :data:`~fedfair.pki.identity.CredentialVerifier` that checks each (name, credential) in full once.

    Every round each party verifies every peer's relayed certificate, and the aggregator every
    advertiser's: a full check (the CA's path validation, role, pins) costs over a millisecond
    each, so n parties pay n^2 of them per round for the same certificates. What the wrapped
    verifier decides is a function of the name and the credential's bytes, except a
    certificate's validity window: so a pair that passed is remembered, and a later call
    re-checks only that window (a certificate outside it goes through the full check again,
    which refuses it). Anything that failed is never remembered.
    """

    def __init__(
        self,
        verify: CredentialVerifier,
        *,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._verify = verify
        self._clock = clock
        self._trusted: dict[tuple[str, bytes], _Trusted] = {}
        self._lock = threading.Lock()

    def replace(self, verify: CredentialVerifier) -> None:
        """Decide by `verify` from now on, forgetting every pair accepted before (a roster update revoked some)."""
        with self._lock:
            self._verify = verify
            self._trusted.clear()

    def __call__(self, name: str, credential: bytes) -> ec.EllipticCurvePublicKey:
        """The P-256 identity key `credential` certifies for `name`, as the wrapped verifier decides.

        Raises:
            IdentityError: the wrapped verifier refuses the pair (nothing is remembered then), including a
                remembered certificate now outside its validity window.
        """
        with self._lock:
            trusted = self._trusted.get((name, credential))
        if trusted is not None and (trusted.window is None or trusted.window[0] <= self._clock() <= trusted.window[1]):
            return trusted.public_key
        with self._lock:
            verify = self._verify
        public_key = verify(name, credential)
        with self._lock:
            if verify is not self._verify:
                return public_key  # decided under a roster replaced meanwhile: not remembered
            if (name, credential) not in self._trusted and len(self._trusted) >= REMEMBERED_CREDENTIALS:
                del self._trusted[next(iter(self._trusted))]
            self._trusted[name, credential] = _Trusted(public_key, _validity_window(credential))
        return public_key


def remembered(verify: CredentialVerifier) -> RememberedVerifier:
    """`verify`, remembering what it accepted (itself if it already does)."""
    return verify if isinstance(verify, RememberedVerifier) else RememberedVerifier(verify)


def _validity_window(credential: bytes) -> tuple[dt.datetime, dt.datetime] | None:
    """A certificate credential's validity window; None for a bare public key, which has none."""
    try:
        if credential.lstrip().startswith(b"-----BEGIN CERTIFICATE"):
            certificate = x509.load_pem_x509_certificate(credential)
        else:
            certificate = x509.load_der_x509_certificate(credential)
    except ValueError:
        return None
    return certificate.not_valid_before_utc, certificate.not_valid_after_utc
