"""Making certificates: the federation's CA, signing requests, and signing them.

A certificate carries the participant's name in the subject common name and as a
DNS subject alternative name, and its role in the extended key usage: server
authentication for the aggregator, client authentication for collaborators. Keys
are ECDSA P-256 signed with SHA-256, the choice :mod:`fedfair.pki.identity` fixes;
the CA signs no other key type. Reading and checking certificates is
:mod:`fedfair.pki.verification`'s job; these functions touch no files.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedfair.core.errors import CertificateError, ConfigError
from fedfair.pki import identity
from fedfair.pki.names import check_role, validate_name

AUDITOR_USAGE = x509.ObjectIdentifier("2.25.45398676809054069507914842903993154368")
"""The extended key usage that marks an auditor's certificate beside client auth: a UUID OID (ITU-T X.667,
no registration needed), so that neither a collaborator's certificate nor an auditor's can pass for the other."""
ROLE_USAGE: dict[str, tuple[x509.ObjectIdentifier, ...]] = {
    "aggregator": (ExtendedKeyUsageOID.SERVER_AUTH,),
    "collaborator": (ExtendedKeyUsageOID.CLIENT_AUTH,),
    "auditor": (ExtendedKeyUsageOID.CLIENT_AUTH, AUDITOR_USAGE),
}
"""The extended key usages each role's certificate carries, exactly."""


def role_of_usages(usages: set[x509.ObjectIdentifier]) -> str | None:
    """The one role whose usages `usages` hold, the most specific (an auditor's hold a collaborator's), or None."""
    held = [role for role, needed in ROLE_USAGE.items() if set(needed) <= usages]
    roles = [role for role in held if not any(set(ROLE_USAGE[role]) < set(ROLE_USAGE[other]) for other in held)]
    return roles[0] if len(roles) == 1 else None


CA_DAYS = 3650
CERT_DAYS = 365
CA_COMMON_NAME = "fedfair CA"
_CLOCK_SKEW = dt.timedelta(minutes=5)
_LOOPBACK_SANS: tuple[x509.GeneralName, ...] = (
    x509.DNSName("localhost"),
    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
)


def generate_private_key() -> ec.EllipticCurvePrivateKey:
    """A fresh identity key (ECDSA P-256, fedfair.pki.identity's choice; the only key type the CA signs)."""
    return identity.generate_identity_key()


def check_p256(public_key: object, what: str) -> None:
    """Raise CertificateError unless ``public_key`` is an ECDSA P-256 key; ``what`` names its holder."""
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or not isinstance(public_key.curve, identity.CURVE):
        raise CertificateError(f"{what} does not hold an ECDSA P-256 key; make it with `fedfair pki request`")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _check_days(days: int) -> None:
    if days < 1:
        raise ConfigError(f"--days must be at least 1, got {days}")


def _key_usage(*, certificate_authority: bool) -> x509.KeyUsage:
    """A CA only signs certificates (and CRLs); a participant only makes signatures."""
    return x509.KeyUsage(
        digital_signature=not certificate_authority,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=certificate_authority,
        crl_sign=certificate_authority,
        encipher_only=False,
        decipher_only=False,
    )


def create_ca(
    common_name: str = CA_COMMON_NAME, *, days: int = CA_DAYS, key: ec.EllipticCurvePrivateKey | None = None
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate and its key (basicConstraints CA, path length 0)."""
    _check_days(days)
    key = key or generate_private_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    key_id = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(certificate_authority=True), critical=True)
        .add_extension(key_id, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(key_id), critical=False)
        .sign(key, identity.SIGNATURE_HASH())
    )
    return certificate, key


def create_request(
    name: str, key: ec.EllipticCurvePrivateKey, role: str | None = None
) -> x509.CertificateSigningRequest:
    """A signing request for ``name``, signed by the participant's own key.

    ``role`` (optional) is written into the request as the extended key usage the
    institution asks for, so the CA holder signs for the role the institution meant
    and a mismatch is caught at signing rather than at the first handshake.
    """
    validate_name(name)
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    )
    if role is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(ROLE_USAGE[check_role(role)])), critical=False)
    return builder.sign(key, identity.SIGNATURE_HASH())


def check_request(request: x509.CertificateSigningRequest) -> str:
    """Check a signing request (signature, P-256 key, one valid name, a well-formed role) and return the name."""
    if not request.is_signature_valid:
        raise CertificateError("the signing request's signature does not verify; ask for a fresh request")
    check_p256(request.public_key(), "the signing request")
    names = request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise CertificateError(
            "the signing request must name exactly one common name; make it with `fedfair pki request`"
        )
    name = validate_name(str(names[0].value))
    requested_role(request)
    return name


def requested_role(request: x509.CertificateSigningRequest) -> str | None:
    """The role a signing request asks for (its extended key usage), or None when it names none.

    A request whose extended key usage names both roles, or none of them, is refused:
    the CA must never guess which role an institution meant.
    """
    try:
        usages = set(request.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return None
    role = role_of_usages(usages)
    if role is None or usages != set(ROLE_USAGE[role]):
        raise CertificateError(
            "the signing request asks for a role other than exactly one of "
            f"{', '.join(ROLE_USAGE)}; make a fresh one with `fedfair pki request --role ROLE`"
        )
    return role


def signing_role(request: x509.CertificateSigningRequest, role: str | None) -> str:
    """The role to sign ``request`` for: the one it asks for, which ``role`` (the CA's choice), if given, must equal."""
    asked = requested_role(request)
    if role is not None:
        check_role(role)
        if asked is not None and asked != role:
            raise CertificateError(
                f"the signing request asks for the {asked} role, not {role}; sign it with `--role {asked}` "
                "or ask the institution for a request with the right role"
            )
        return role
    if asked is None:
        raise CertificateError("the signing request names no role; sign it with `--role aggregator|collaborator`")
    return asked


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(validate_name(host.lower()))


def sign_request(
    request: x509.CertificateSigningRequest,
    ca_certificate: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    role: str | None = None,
    *,
    days: int = CERT_DAYS,
    not_before: dt.datetime | None = None,
    hosts: Iterable[str] = (),
) -> x509.Certificate:
    """Issue a certificate for a checked request.

    ``role`` None signs for the role the request asks for (:func:`signing_role`). The
    name goes into CN and a DNS SAN; the aggregator also gets ``localhost`` and
    ``127.0.0.1`` (so loopback works) plus any extra ``hosts`` (DNS names or IPs).
    ``not_before`` (default: now, less five minutes of clock skew) exists for tests
    that need a certificate whose window has passed.
    """
    name = check_request(request)
    role = signing_role(request, role)
    _check_days(days)
    start = not_before or (_now() - _CLOCK_SKEW)
    sans: list[x509.GeneralName] = [x509.DNSName(name)]
    if role == "aggregator":
        sans += list(_LOOPBACK_SANS)
    for host in hosts:
        general = _host_name(host)
        if general not in sans:
            sans.append(general)
    ca_key_id = ca_certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_certificate.subject)
        .public_key(request.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(certificate_authority=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(ROLE_USAGE[role])), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(request.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id), critical=False)
        .sign(ca_key, identity.SIGNATURE_HASH())
    )
