"""Checking certificates: who a certificate names, for which role, and whether this CA vouches for it.

The transport takes a peer's identity from its certificate alone, and secure
aggregation trusts a relayed key only through :func:`credential_verifier` (or
:func:`pinned_credential_verifier`, which also pins each name to one certificate
fingerprint), so every acceptance goes through :func:`verify_certificate`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from fedfair.core.errors import CertificateError, ConfigError, IdentityError
from fedfair.pki import identity
from fedfair.pki.certificates import check_p256, role_of_usages
from fedfair.pki.names import check_role, validate_name


def name_from_certificate(certificate: x509.Certificate) -> str:
    """The participant name a certificate carries: its CN, which must also be a DNS SAN."""
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise CertificateError("the certificate must carry exactly one common name; reissue it with `fedfair pki sign`")
    name = validate_name(str(names[0].value))
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CertificateError(
            "the certificate has no subject alternative name; reissue it with `fedfair pki sign`"
        ) from None
    if name not in sans.get_values_for_type(x509.DNSName):
        raise CertificateError(
            "the certificate's common name is not among its DNS names; reissue it with `fedfair pki sign`"
        )
    return name


def role_of_certificate(certificate: x509.Certificate) -> str | None:
    """'aggregator', 'collaborator', 'auditor', or None when the extended key usage names no one role."""
    try:
        usages = set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return None
    return role_of_usages(usages)


def verify_certificate(
    certificate: x509.Certificate, ca_certificate: x509.Certificate, role: str, *, now: dt.datetime | None = None
) -> str:
    """Verify ``certificate`` was issued by ``ca_certificate`` for ``role`` and is valid now; return its name.

    Checks the validity window (an expired certificate is named as expired), the chain
    (cryptography's RFC 5280 path validation), the P-256 key, the key usage of the role (server auth for the aggregator, client
    auth for collaborators, client auth and the auditor's mark for an auditor; never two roles) and that CN equals a DNS SAN.
    """
    check_role(role)
    name = name_from_certificate(certificate)
    check_p256(certificate.public_key(), "the certificate")
    if role_of_certificate(certificate) != role:
        raise CertificateError(f"the certificate was not issued for the {role} role; reissue it with `--role {role}`")
    now = now or dt.datetime.now(dt.UTC)
    if now > certificate.not_valid_after_utc:
        raise CertificateError(
            f"the certificate of {name} expired on {certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; have a new "
            "one signed for the same key (`fedfair pki sign`) or issued (`fedfair pki issue`), and pin it"
        )
    if now < certificate.not_valid_before_utc:
        raise CertificateError(
            f"the certificate of {name} is not valid before {certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC; "
            "check this machine's clock, or wait until then"
        )
    builder = PolicyBuilder().store(Store([ca_certificate])).time(now).max_chain_depth(0)
    try:
        if role == "aggregator":
            builder.build_server_verifier(x509.DNSName(name)).verify(certificate, [])
        else:
            builder.build_client_verifier().verify(certificate, [])
    except VerificationError as error:
        raise CertificateError(
            f"the certificate does not verify against this federation's CA ({error}); "
            "check it is unexpired and signed by this ca.crt"
        ) from None
    return name


def _credential_certificate(credential: bytes) -> x509.Certificate:
    """The certificate a relayed credential holds (PEM or DER)."""
    try:
        if credential.lstrip().startswith(b"-----"):
            return x509.load_pem_x509_certificate(credential)
        return x509.load_der_x509_certificate(credential)
    except ValueError:
        raise IdentityError("the credential is not an X.509 certificate; relay the party's NAME.crt") from None


def _certified_key(
    certificate: x509.Certificate, ca_certificate: x509.Certificate, role: str, name: str
) -> ec.EllipticCurvePublicKey:
    """The public key of ``certificate`` if this CA issued it for ``role`` to ``name``, valid now."""
    try:
        certified = verify_certificate(certificate, ca_certificate, role)
    except ConfigError as error:
        raise IdentityError(str(error)) from None
    if certified != name:
        raise IdentityError("the certificate was issued to another party; relay the party's own certificate")
    public_key = certificate.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    return public_key


def credential_verifier(ca_certificate: x509.Certificate, role: str = "collaborator") -> identity.CredentialVerifier:
    """A :data:`fedfair.pki.identity.CredentialVerifier` backed by this CA.

    Secure aggregation calls ``verify(name, credential)`` on each certificate the
    aggregator relays: the credential must be a certificate (PEM or DER) this CA
    issued for ``role``, valid now, naming ``name``; its public key is returned.
    Bare public keys are refused: with a PKI, only certificates count.
    """
    check_role(role)

    def verify(name: str, credential: bytes) -> ec.EllipticCurvePublicKey:
        return _certified_key(_credential_certificate(credential), ca_certificate, role, name)

    return verify


def pinned_credential_verifier(
    ca_certificate: x509.Certificate, pins: Mapping[str, str], role: str = "collaborator", revoked: Iterable[str] = ()
) -> identity.CredentialVerifier:
    """A CredentialVerifier that also pins each name to one certificate: ``pins`` maps name -> SHA-256 fingerprint.

    A credential is accepted for ``name`` only if this CA issued it for ``role`` to
    ``name`` (as :func:`credential_verifier` checks) AND its fingerprint is the one
    pinned for ``name``. The CA alone can mint a second certificate for any name (a
    twin with a key of its own) or for names nobody agreed on; a pinned verifier
    refuses both, so whoever holds the CA cannot fill a round with parties of its own. A fingerprint in
    ``revoked`` is refused as revoked.
    """
    check_role(role)
    pinned = {name: normalise_fingerprint(value) for name, value in pins.items()}
    gone = frozenset(normalise_fingerprint(value) for value in revoked)

    def verify(name: str, credential: bytes) -> ec.EllipticCurvePublicKey:
        if name not in pinned:
            raise IdentityError(f"{name!r} is not in the federation's manifest; refuse any round that includes it")
        certificate = _credential_certificate(credential)
        public_key = _certified_key(certificate, ca_certificate, role, name)
        if fingerprint(certificate) in gone:
            raise IdentityError(
                f"the certificate relayed for {name!r} (sha256 {fingerprint(certificate)}) was revoked in the "
                "federation's manifest: refuse it"
            )
        if fingerprint(certificate) != pinned[name]:
            raise IdentityError(
                f"the certificate relayed for {name!r} (sha256 {fingerprint(certificate)}) is not the one the "
                "manifest pins for it; the CA has issued another certificate for this name: refuse it"
            )
        return public_key

    return verify


def fingerprint(certificate: x509.Certificate) -> str:
    """SHA-256 of the DER certificate, colon-separated lower-case hex (what operators compare out of band)."""
    return certificate.fingerprint(hashes.SHA256()).hex(":")


def der_fingerprint(der: bytes) -> str:
    """:func:`fingerprint` of a DER-encoded certificate, without parsing it (what a TLS peer presents)."""
    return hashlib.sha256(der).digest().hex(":")


def normalise_fingerprint(text: str) -> str:
    """A SHA-256 fingerprint in the form :func:`fingerprint` writes, from hex with or without colons, any case."""
    digits = text.strip().lower().replace(":", "") if isinstance(text, str) else ""
    if len(digits) != 64 or not all(character in "0123456789abcdef" for character in digits):
        raise ConfigError(f"{text!r} is not a SHA-256 fingerprint; copy the 64 hex digits `fedfair pki show` prints")
    return bytes.fromhex(digits).hex(":")
