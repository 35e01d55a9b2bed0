"""Helpers shared by the PKI tests: file modes and hand-made signing requests."""

from __future__ import annotations

import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
)
from cryptography.x509.oid import NameOID, ObjectIdentifier


def mode(path: Path) -> int:
    """The permission bits of ``path`` (0o600 for a private key)."""
    return stat.S_IMODE(path.stat().st_mode)


def request_with_key(
    name: str, key: CertificateIssuerPrivateKeyTypes, usages: tuple[ObjectIdentifier, ...] = ()
) -> x509.CertificateSigningRequest:
    """A signing request built by hand, so that tests can use names, key types and extended key
    usages (`usages`, none by default) that `create_request` refuses."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    return builder.sign(key, hashes.SHA256())
