"""Identity keys: the one place that fixes which signature scheme fedfair uses.

Every party (aggregator or collaborator) holds one long-lived identity key, the key
its mTLS certificate certifies. fedfair uses ECDSA on P-256 with SHA-256, the key
type the federation's PKI issues. Secure aggregation signs each round's ephemeral
keys with it, so an aggregator cannot substitute its own keys for a peer's; the
PKI module reuses the same choice for certificates. Keeping the choice here means
changing the curve or hash is a one-file change.

Why: docs/design.md, "Inside the PKI".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import IdentityError

CURVE = ec.SECP256R1
"""The identity key curve (NIST P-256)."""

SIGNATURE_HASH = hashes.SHA256
"""The hash ECDSA signs with."""

CredentialVerifier = Callable[[str, bytes], ec.EllipticCurvePublicKey]
"""``verify(name, credential) -> public key``; raises :class:`IdentityError` when the
credential does not belong to ``name`` or is not trusted."""


def generate_identity_key() -> ec.EllipticCurvePrivateKey:
    """A fresh identity private key on the fedfair curve."""
    return ec.generate_private_key(CURVE())


def sign(private_key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    """DER-encoded ECDSA-SHA256 signature of ``data``."""
    return private_key.sign(data, ec.ECDSA(SIGNATURE_HASH()))


def is_valid_signature(public_key: ec.EllipticCurvePublicKey, signature: bytes, data: bytes) -> bool:
    """Whether ``signature`` is a valid ECDSA-SHA256 signature of ``data`` under ``public_key``."""
    try:
        public_key.verify(signature, data, ec.ECDSA(SIGNATURE_HASH()))
    except InvalidSignature:
        return False
    return True


def public_key_bytes(key: ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey) -> bytes:
    """DER SubjectPublicKeyInfo of an identity key (the bare-key credential)."""
    public = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_public_key(der: bytes) -> ec.EllipticCurvePublicKey:
    """Parse a DER SubjectPublicKeyInfo and insist it is a key on the fedfair curve."""
    try:
        key = serialization.load_der_public_key(der)
    except ValueError as error:
        raise IdentityError(f"not a DER public key: {error}") from None
    return _require_curve(key)


def public_key_from_certificate(certificate: bytes) -> ec.EllipticCurvePublicKey:
    """The identity public key inside a certificate (PEM or DER).

    Only extracts the key: checking the chain to the federation CA and the name is
    the PKI's job (see :data:`CredentialVerifier`).
    """
    loader = (
        x509.load_pem_x509_certificate if certificate.lstrip().startswith(b"-----") else x509.load_der_x509_certificate
    )
    try:
        cert = loader(certificate)
    except ValueError as error:
        raise IdentityError(f"not an X.509 certificate: {error}") from None
    return _require_curve(cert.public_key())


def public_key_from_credential(credential: bytes) -> ec.EllipticCurvePublicKey:
    """The public key in a credential, which is a certificate or a bare DER public key."""
    try:
        return public_key_from_certificate(credential)
    except IdentityError:
        return load_public_key(credential)


def pinned_verifier(keys: Mapping[str, ec.EllipticCurvePublicKey]) -> CredentialVerifier:
    """A verifier that trusts exactly the given name -> public key table.

    Used before a PKI exists (tests, the demo, a federation that distributes keys out
    of band): a credential is accepted for ``name`` only if the key it carries equals
    the pinned key, so a relayed credential cannot smuggle in another key.
    """
    pinned = {name: public_key_bytes(key) for name, key in keys.items()}

    def verify(name: str, credential: bytes) -> ec.EllipticCurvePublicKey:
        if name not in pinned:
            raise IdentityError("no pinned identity key for this party; add it to the pinned table")
        key = public_key_from_credential(credential)
        if public_key_bytes(key) != pinned[name]:
            raise IdentityError("credential carries a different key than the one pinned for this party")
        return key

    return verify


def _require_curve(key: object) -> ec.EllipticCurvePublicKey:
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, CURVE):
        raise IdentityError("identity keys must be ECDSA P-256; issue a P-256 key for this party")
    return key
