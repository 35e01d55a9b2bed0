"""The federation's public-key infrastructure: one CA, one certificate per participant.

Everything lives in one folder (DESIGN.md section 5)::

    ca.crt  ca.key          the federation's CA (ECDSA P-256, SHA-256)
    NAME.key                a participant's private key (mode 0600, never leaves its machine)
    NAME.csr                its signing request (travels to the CA operator)
    NAME.crt                its certificate (travels back, with ca.crt)

A certificate carries the participant's name in the subject common name and as a
DNS subject alternative name, and its role in the extended key usage: server
authentication for the aggregator, client authentication for collaborators. The
transport takes a peer's identity from this certificate alone.

``fedfair pki init | request | sign | issue | show`` drive these functions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import (
    DNSName,
    PolicyBuilder,
    Store,
    VerificationError,
)

from fedfair.core.errors import ConfigError
from fedfair.pki import identity

ROLES = ("aggregator", "collaborator")
ROLE_USAGE = {
    "aggregator": ExtendedKeyUsageOID.SERVER_AUTH,
    "collaborator": ExtendedKeyUsageOID.CLIENT_AUTH,
}
CA_DAYS = 3650
CERT_DAYS = 365
CA_COMMON_NAME = "fedfair CA"
# Names double as DNS names (in the SAN) and file names: lower-case DNS labels joined by dots.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_NAME_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_RESERVED_NAMES = frozenset({"ca"})
_CLOCK_SKEW = dt.timedelta(minutes=5)
_LOOPBACK_SANS: tuple[x509.GeneralName, ...] = (
    x509.DNSName("localhost"),
    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
)


class CertificateError(ConfigError):
    """A certificate or signing request fails a check (wrong CA, expired, wrong role, bad key)."""


# ---------------------------------------------------------------- names and keys


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid participant name, else raise ConfigError."""
    if not isinstance(name, str) or len(name) > 253 or not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"invalid participant name {name!r}; use lower-case letters, digits and hyphens"
            " (dots between labels), e.g. 'hospital-a'"
        )
    if name in _RESERVED_NAMES:
        raise ConfigError(f"the name {name!r} is reserved for the CA's own files; choose another name")
    return name


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}; choose one of: {', '.join(ROLES)}")
    return role


def generate_private_key() -> ec.EllipticCurvePrivateKey:
    """A fresh identity key (ECDSA P-256, fedfair.pki.identity's choice; the only key type the CA signs)."""
    return identity.generate_identity_key()


def _check_p256(public_key: object, what: str) -> None:
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or not isinstance(public_key.curve, identity.CURVE):
        raise CertificateError(f"{what} does not hold an ECDSA P-256 key; make it with `fedfair pki request`")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ---------------------------------------------------------------- CA, requests, signing


def create_ca(
    common_name: str = CA_COMMON_NAME, *, days: int = CA_DAYS, key: ec.EllipticCurvePrivateKey | None = None
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate and its key (basicConstraints CA, path length 0)."""
    if days < 1:
        raise ConfigError(f"--days must be at least 1, got {days}")
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
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(key_id, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(key_id), critical=False)
        .sign(key, identity.SIGNATURE_HASH())
    )
    return certificate, key


def create_request(name: str, key: ec.EllipticCurvePrivateKey) -> x509.CertificateSigningRequest:
    """A signing request for ``name``, signed by the participant's own key."""
    validate_name(name)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, identity.SIGNATURE_HASH())


def check_request(request: x509.CertificateSigningRequest) -> str:
    """Check a signing request (signature, P-256 key, one valid name) and return the name."""
    if not request.is_signature_valid:
        raise CertificateError("the signing request's signature does not verify; ask for a fresh request")
    _check_p256(request.public_key(), "the signing request")
    names = request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise CertificateError(
            "the signing request must name exactly one common name; make it with `fedfair pki request`"
        )
    return validate_name(str(names[0].value))


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(validate_name(host.lower()))


def sign_request(
    request: x509.CertificateSigningRequest,
    ca_certificate: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    role: str,
    *,
    days: int = CERT_DAYS,
    not_before: dt.datetime | None = None,
    hosts: Iterable[str] = (),
) -> x509.Certificate:
    """Issue a certificate for a checked request.

    The name goes into CN and a DNS SAN; the aggregator also gets ``localhost`` and
    ``127.0.0.1`` (so loopback works) plus any extra ``hosts`` (DNS names or IPs).
    ``not_before`` (default: now, less five minutes of clock skew) exists for tests
    that need a certificate whose window has passed.
    """
    _check_role(role)
    name = check_request(request)
    if days < 1:
        raise ConfigError(f"--days must be at least 1, got {days}")
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
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ROLE_USAGE[role]]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(request.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id), critical=False)
        .sign(ca_key, identity.SIGNATURE_HASH())
    )


# ---------------------------------------------------------------- reading certificates


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
    """'aggregator', 'collaborator', or None when the extended key usage names neither (or both)."""
    try:
        usages = set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return None
    roles = [role for role, usage in ROLE_USAGE.items() if usage in usages]
    return roles[0] if len(roles) == 1 else None


def verify_certificate(
    certificate: x509.Certificate, ca_certificate: x509.Certificate, role: str, *, now: dt.datetime | None = None
) -> str:
    """Verify ``certificate`` was issued by ``ca_certificate`` for ``role`` and is valid now; return its name.

    Checks the chain and validity window (cryptography's RFC 5280 path validation),
    the P-256 key, the key usage of the role (server auth for the aggregator, client
    auth for collaborators, never both) and that CN equals a DNS SAN.
    """
    _check_role(role)
    name = name_from_certificate(certificate)
    _check_p256(certificate.public_key(), "the certificate")
    if role_of_certificate(certificate) != role:
        raise CertificateError(f"the certificate was not issued for the {role} role; reissue it with `--role {role}`")
    builder = PolicyBuilder().store(Store([ca_certificate])).time(now or _now()).max_chain_depth(0)
    try:
        if role == "aggregator":
            builder.build_server_verifier(DNSName(name)).verify(certificate, [])
        else:
            builder.build_client_verifier().verify(certificate, [])
    except VerificationError as error:
        raise CertificateError(
            f"the certificate does not verify against this federation's CA ({error}); "
            "check it is unexpired and signed by this ca.crt"
        ) from None
    return name


def credential_verifier(ca_certificate: x509.Certificate, role: str = "collaborator") -> identity.CredentialVerifier:
    """A :data:`fedfair.pki.identity.CredentialVerifier` backed by this CA.

    Secure aggregation calls ``verify(name, credential)`` on each certificate the
    aggregator relays: the credential must be a certificate (PEM or DER) this CA
    issued for ``role``, valid now, naming ``name``; its public key is returned.
    Bare public keys are refused: with a PKI, only certificates count.
    """
    _check_role(role)

    def verify(name: str, credential: bytes) -> ec.EllipticCurvePublicKey:
        try:
            if credential.lstrip().startswith(b"-----"):
                certificate = x509.load_pem_x509_certificate(credential)
            else:
                certificate = x509.load_der_x509_certificate(credential)
        except ValueError:
            raise identity.IdentityError(
                "the credential is not an X.509 certificate; relay the party's NAME.crt"
            ) from None
        try:
            certified = verify_certificate(certificate, ca_certificate, role)
        except ConfigError as error:
            raise identity.IdentityError(str(error)) from None
        if certified != name:
            raise identity.IdentityError(
                "the certificate was issued to another party; relay the party's own certificate"
            )
        public_key = certificate.public_key()
        assert isinstance(public_key, ec.EllipticCurvePublicKey)
        return public_key

    return verify


def fingerprint(certificate: x509.Certificate) -> str:
    """SHA-256 fingerprint, colon-separated hex (what operators compare out of band)."""
    return certificate.fingerprint(hashes.SHA256()).hex(":")


# ---------------------------------------------------------------- files


def ca_paths(directory: Path) -> tuple[Path, Path]:
    """(ca.crt, ca.key) in ``directory``."""
    return directory / "ca.crt", directory / "ca.key"


def participant_paths(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """(NAME.crt, NAME.key, NAME.csr) in ``directory``."""
    validate_name(name)
    return directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.csr"


def _write(path: Path, data: bytes, mode: int, *, overwrite: bool = False) -> None:
    """Write atomically (temp file, fsync, rename) with an exact permission mode."""
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} already exists; move it away first (it is never overwritten silently)")
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(descriptor, mode)  # exact mode, whatever the umask
        os.write(descriptor, data)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} not found; check the path (see certs/README.md)") from None
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror}; check its permissions") from None


def load_certificate(path: Path | str) -> x509.Certificate:
    """Read a PEM certificate."""
    data = _read(Path(path), "certificate")
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise ConfigError(f"{path} is not a PEM certificate; point at a NAME.crt made by `fedfair pki`") from None


def load_request(path: Path | str) -> x509.CertificateSigningRequest:
    """Read a PEM signing request."""
    data = _read(Path(path), "signing request")
    try:
        return x509.load_pem_x509_csr(data)
    except ValueError:
        raise ConfigError(f"{path} is not a PEM signing request; make it with `fedfair pki request`") from None


def load_private_key(path: Path | str) -> ec.EllipticCurvePrivateKey:
    """Read a PEM private key, refusing one that others can read (like ssh does)."""
    path = Path(path)
    data = _read(path, "private key")
    if os.name == "posix" and stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise ConfigError(f"private key {path} is readable by other users; run `chmod 600 {path}`")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"{path} is not an unencrypted PEM private key; make it with `fedfair pki request`") from None
    _check_p256(key.public_key(), f"private key {path}")
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def init_ca(directory: Path | str, *, common_name: str = CA_COMMON_NAME, days: int = CA_DAYS) -> Path:
    """Create ca.crt and ca.key (0600) in ``directory``; refuse to replace an existing CA."""
    directory = Path(directory)
    cert_path, key_path = ca_paths(directory)
    for path in (cert_path, key_path):
        if path.exists():
            raise ConfigError(f"{path} already exists; this folder already has a CA (use another --dir)")
    certificate, key = create_ca(common_name, days=days)
    _write(key_path, _private_pem(key), 0o600)
    _write(cert_path, certificate.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert_path


def request_certificate(directory: Path | str, name: str) -> tuple[Path, Path]:
    """At an institution: write NAME.key (0600) and NAME.csr; return their paths."""
    directory = Path(directory)
    _, key_path, csr_path = participant_paths(directory, name)
    if key_path.exists():
        raise ConfigError(f"{key_path} already exists; keep using it or move it away to make a new key")
    key = generate_private_key()
    request = create_request(name, key)
    _write(key_path, _private_pem(key), 0o600)
    _write(csr_path, request.public_bytes(serialization.Encoding.PEM), 0o644, overwrite=True)
    return key_path, csr_path


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = ca_paths(directory)
    if not key_path.exists():
        raise ConfigError(f"no CA key at {key_path}; run `fedfair pki init --dir {directory}` first (at the CA)")
    return load_certificate(cert_path), load_private_key(key_path)


def sign_certificate(
    directory: Path | str,
    request_path: Path | str,
    role: str,
    *,
    days: int = CERT_DAYS,
    hosts: Sequence[str] = (),
    overwrite: bool = False,
) -> Path:
    """At the CA: check a signing request and write NAME.crt into ``directory``."""
    directory = Path(directory)
    _check_role(role)
    ca_certificate, ca_key = _load_ca(directory)
    certificate = sign_request(load_request(request_path), ca_certificate, ca_key, role, days=days, hosts=hosts)
    cert_path, _, _ = participant_paths(directory, name_from_certificate(certificate))
    _write(cert_path, certificate.public_bytes(serialization.Encoding.PEM), 0o644, overwrite=overwrite)
    return cert_path


def issue(directory: Path | str, role: str, name: str, *, days: int = CERT_DAYS, hosts: Sequence[str] = ()) -> Path:
    """Both steps in one folder (local demos): NAME.key, then NAME.crt signed by the CA there."""
    directory = Path(directory)
    _check_role(role)
    _load_ca(directory)  # fail before making a key if there is no CA here
    _, csr_path = request_certificate(directory, name)
    try:
        return sign_certificate(directory, csr_path, role, days=days, hosts=hosts)
    finally:
        csr_path.unlink(missing_ok=True)


def describe(directory: Path | str, name: str | None = None) -> list[str]:
    """Human-readable lines about the CA and the certificates in ``directory``."""
    directory = Path(directory)
    ca_cert_path, ca_key_path = ca_paths(directory)
    ca_certificate = load_certificate(ca_cert_path)
    key_note = "key here" if ca_key_path.exists() else "no key here"
    lines = [
        f"CA       {ca_certificate.subject.rfc4514_string()}  "
        + f"valid until {ca_certificate.not_valid_after_utc:%Y-%m-%d}  {key_note}",
        f"         sha256 {fingerprint(ca_certificate)}",
    ]
    if name is not None:
        paths = [participant_paths(directory, name)[0]]
    else:
        paths = sorted(path for path in directory.glob("*.crt") if path.name != "ca.crt")
    for path in paths:
        certificate = load_certificate(path)
        role = role_of_certificate(certificate) or "unknown-role"
        try:
            label = verify_certificate(certificate, ca_certificate, role if role in ROLES else "collaborator")
            status = "valid"
        except ConfigError as error:
            label, status = path.stem, f"INVALID: {error}"
        key_path = path.with_suffix(".key")
        key_note = f"key {oct(stat.S_IMODE(key_path.stat().st_mode))}" if key_path.exists() else "no key here"
        try:
            sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            hosts = ", ".join(str(general.value) for general in sans)
        except x509.ExtensionNotFound:
            hosts = "no SAN"
        lines.append(
            f"{label:<8} {role:<12} until {certificate.not_valid_after_utc:%Y-%m-%d}  {key_note}  [{hosts}]  {status}"
        )
    return lines


# ---------------------------------------------------------------- the `fedfair pki` command


def _cmd_init(args: argparse.Namespace) -> int:
    path = init_ca(args.dir, common_name=args.common_name, days=args.days)
    print(f"created the CA: {path} and {path.with_suffix('.key')} (keep ca.key secret; share ca.crt)")
    return 0


def _cmd_request(args: argparse.Namespace) -> int:
    key_path, csr_path = request_certificate(args.dir, args.name)
    print(f"wrote {key_path} (0600, stays here) and {csr_path}")
    print(f"next: send {csr_path.name} to the CA operator; put the returned {args.name}.crt and ca.crt in {args.dir}")
    return 0


def _cmd_sign(args: argparse.Namespace) -> int:
    path = sign_certificate(args.dir, args.csr, args.role, days=args.days, hosts=args.host, overwrite=args.force)
    certificate = load_certificate(path)
    print(f"issued {path} for {path.stem} ({args.role}), sha256 {fingerprint(certificate)}")
    print(f"next: send {path.name} and ca.crt back to {path.stem}")
    return 0


def _cmd_issue(args: argparse.Namespace) -> int:
    path = issue(args.dir, args.role, args.name, days=args.days, hosts=args.host)
    print(f"issued {path} and {path.with_suffix('.key')} (0600) for {args.name} ({args.role})")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    for line in describe(args.dir, args.name):
        print(line)
    return 0


def register_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``fedfair pki {init,request,sign,issue,show}``."""
    pki = subparsers.add_parser("pki", help="certificates: a CA per federation, one certificate per participant")
    commands = pki.add_subparsers(dest="pki_command", required=True, metavar="STEP")

    def add(name: str, help_text: str, handler) -> argparse.ArgumentParser:  # type: ignore[no-untyped-def]
        parser = commands.add_parser(name, help=help_text, description=help_text)
        parser.add_argument("--dir", type=Path, required=True, help="the certificates folder")
        parser.set_defaults(handler=handler)
        return parser

    init = add("init", "create the federation's CA (ca.crt, ca.key)", _cmd_init)
    init.add_argument("--days", type=int, default=CA_DAYS, help=f"validity (default {CA_DAYS})")
    init.add_argument("--common-name", default=CA_COMMON_NAME, help="the CA's subject name")

    request = add("request", "at an institution: make NAME.key (stays) and NAME.csr (travels)", _cmd_request)
    request.add_argument("--name", required=True, help="the participant name, e.g. hospital-a")

    for name, help_text, handler in (
        ("sign", "at the CA: check NAME.csr and issue NAME.crt", _cmd_sign),
        ("issue", "request and sign in one folder (local demos)", _cmd_issue),
    ):
        parser = add(name, help_text, handler)
        if name == "sign":
            parser.add_argument("--csr", type=Path, required=True, help="the signing request to check and sign")
            parser.add_argument("--force", action="store_true", help="replace an existing NAME.crt (renewal)")
        else:
            parser.add_argument("--name", required=True, help="the participant name, e.g. hospital-a")
        parser.add_argument("--role", choices=ROLES, required=True)
        parser.add_argument("--days", type=int, default=CERT_DAYS, help=f"validity (default {CERT_DAYS})")
        parser.add_argument(
            "--host", action="append", default=[], help="extra DNS name or IP in the certificate (repeatable)"
        )

    show = add("show", "list the CA and certificates with role, expiry and status", _cmd_show)
    show.add_argument("--name", default=None, help="only this participant")
