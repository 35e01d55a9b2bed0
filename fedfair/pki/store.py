"""The certificates folder on disk: where each file lives, writing it safely, reading it back.

Everything lives in one folder (DESIGN.md section 5)::

    ca.crt  ca.key          the federation's CA (ECDSA P-256, SHA-256)
    NAME.key                a participant's private key (mode 0600, never leaves its machine)
    NAME.csr                its signing request (travels to the CA operator)
    NAME.crt                its certificate (travels back, with ca.crt)

Files are written atomically with an exact mode and never overwritten silently;
a private key that other users can read is refused, as ssh does.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write
from fedfair.pki.certificates import (
    CA_COMMON_NAME,
    CA_DAYS,
    CERT_DAYS,
    check_p256,
    create_ca,
    create_request,
    generate_private_key,
    sign_request,
)
from fedfair.pki.names import ROLES, check_role, validate_name
from fedfair.pki.verification import (
    fingerprint,
    name_from_certificate,
    role_of_certificate,
    verify_certificate,
)

_Parsed = TypeVar("_Parsed")


def ca_paths(directory: Path) -> tuple[Path, Path]:
    """(ca.crt, ca.key) in ``directory``."""
    return directory / "ca.crt", directory / "ca.key"


def participant_paths(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """(NAME.crt, NAME.key, NAME.csr) in ``directory``."""
    validate_name(name)
    return directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.csr"


def write_file(path: Path, data: bytes, mode: int, *, overwrite: bool = False) -> None:
    """Write `data` to `path` atomically, with exactly the permission `mode`, whatever the umask.

    Atomic as fedfair.core.files.atomic_write: a temporary file (0600 from the start) in the same
    folder, fsync, rename, fsync of the folder.

    Raises:
        ConfigError: `path` exists and `overwrite` is False; it is never replaced silently.
    """
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} already exists; move it away first (it is never overwritten silently)")

    def write(stream: IO[bytes]) -> None:
        # The temporary file starts as 0600, so a key is never readable by others, even briefly;
        # then the exact mode, whatever the umask.
        if hasattr(os, "fchmod"):
            os.fchmod(stream.fileno(), mode)
        stream.write(data)

    atomic_write(path, write)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"{what} {path} not found; check the path (`fedfair pki request` and `pki sign` make them; your federation's README.md says where)"
        ) from None
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror}; check its permissions") from None


def _load_pem(path: Path | str, what: str, parse: Callable[[bytes], _Parsed], remedy: str) -> _Parsed:
    """Read and parse ``path``; when it holds something else, say what it should be and how to make it."""
    data = _read(Path(path), what)
    try:
        return parse(data)
    except ValueError:
        raise ConfigError(f"{path} is not a PEM {what}; {remedy}") from None


def load_certificate(path: Path | str) -> x509.Certificate:
    """Read a PEM certificate."""
    return _load_pem(path, "certificate", x509.load_pem_x509_certificate, "point at a NAME.crt made by `fedfair pki`")


def load_request(path: Path | str) -> x509.CertificateSigningRequest:
    """Read a PEM signing request."""
    return _load_pem(path, "signing request", x509.load_pem_x509_csr, "make it with `fedfair pki request`")


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
    check_p256(key.public_key(), f"private key {path}")
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
    write_file(key_path, _private_pem(key), 0o600)
    write_file(cert_path, certificate.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert_path


def request_certificate(directory: Path | str, name: str, role: str | None = None) -> tuple[Path, Path]:
    """At an institution: write NAME.key (0600) and NAME.csr (asking for ``role`` if given); return their paths."""
    directory = Path(directory)
    _, key_path, csr_path = participant_paths(directory, name)
    if key_path.exists():
        raise ConfigError(f"{key_path} already exists; keep using it or move it away to make a new key")
    key = generate_private_key()
    request = create_request(name, key, role)
    write_file(key_path, _private_pem(key), 0o600)
    write_file(csr_path, request.public_bytes(serialization.Encoding.PEM), 0o644, overwrite=True)
    return key_path, csr_path


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = ca_paths(directory)
    if not key_path.exists():
        raise ConfigError(f"no CA key at {key_path}; run `fedfair pki init --dir {directory}` first (at the CA)")
    return load_certificate(cert_path), load_private_key(key_path)


def sign_certificate(
    directory: Path | str,
    request_path: Path | str,
    role: str | None = None,
    *,
    days: int = CERT_DAYS,
    hosts: Sequence[str] = (),
    overwrite: bool = False,
    out: Path | str | None = None,
) -> Path:
    """At the CA held in ``directory``: check a signing request and write the certificate.

    ``role`` None signs for the role the request asks for; the certificate goes to
    ``out``, by default NAME.crt in ``directory``. Nothing is written unless the
    request passes every check.
    """
    directory = Path(directory)
    ca_certificate, ca_key = _load_ca(directory)
    certificate = sign_request(load_request(request_path), ca_certificate, ca_key, role, days=days, hosts=hosts)
    cert_path = Path(out) if out is not None else participant_paths(directory, name_from_certificate(certificate))[0]
    write_file(cert_path, certificate.public_bytes(serialization.Encoding.PEM), 0o644, overwrite=overwrite)
    return cert_path


def issue(directory: Path | str, role: str, name: str, *, days: int = CERT_DAYS, hosts: Sequence[str] = ()) -> Path:
    """Request and sign in one folder (local demos): NAME.key and NAME.crt, signed by the CA there.

    Everything is made and checked in memory first (the CA, the name, the role, the
    validity, the hosts), so a refused flag leaves no file behind; then the key and
    the certificate are written, and a failed certificate write takes the key away again.
    """
    directory = Path(directory)
    check_role(role)
    ca_certificate, ca_key = _load_ca(directory)
    cert_path, key_path, _ = participant_paths(directory, name)
    for path in (key_path, cert_path):
        if path.exists():
            raise ConfigError(f"{path} already exists; move it away first (it is never overwritten silently)")
    key = generate_private_key()
    certificate = sign_request(create_request(name, key, role), ca_certificate, ca_key, role, days=days, hosts=hosts)
    write_file(key_path, _private_pem(key), 0o600)
    try:
        write_file(cert_path, certificate.public_bytes(serialization.Encoding.PEM), 0o644)
    except BaseException:
        key_path.unlink(missing_ok=True)
        raise
    return cert_path


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
