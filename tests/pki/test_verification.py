"""Checking certificates: another CA, the validity window, and the verifier secure aggregation uses."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fedfair.pki import identity, store
from fedfair.pki.certificates import (
    CertificateError,
    create_request,
    generate_private_key,
    sign_request,
)
from fedfair.pki.verification import credential_verifier, verify_certificate


def test_verify_refuses_a_certificate_from_another_ca(ca_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    store.init_ca(other)
    foreign = store.load_certificate(store.issue(other, "collaborator", "hospital-a"))
    ca_certificate = store.load_certificate(ca_dir / "ca.crt")
    with pytest.raises(CertificateError, match="does not verify"):
        verify_certificate(foreign, ca_certificate, "collaborator")


def test_verify_refuses_a_certificate_outside_its_validity_window(ca_dir: Path) -> None:
    ca_certificate = store.load_certificate(ca_dir / "ca.crt")
    ca_key = store.load_private_key(ca_dir / "ca.key")
    request = create_request("hospital-a", generate_private_key())
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    expired = sign_request(request, ca_certificate, ca_key, "collaborator", days=5, not_before=past)
    with pytest.raises(CertificateError, match="does not verify"):
        verify_certificate(expired, ca_certificate, "collaborator")
    fresh = sign_request(request, ca_certificate, ca_key, "collaborator", days=30)
    assert verify_certificate(fresh, ca_certificate, "collaborator") == "hospital-a"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=31)
    with pytest.raises(CertificateError, match="does not verify"):
        verify_certificate(fresh, ca_certificate, "collaborator", now=later)
    future = sign_request(request, ca_certificate, ca_key, "collaborator", not_before=later)
    with pytest.raises(CertificateError, match="does not verify"):
        verify_certificate(future, ca_certificate, "collaborator")


def test_credential_verifier_for_secure_aggregation(ca_dir: Path, tmp_path: Path) -> None:
    verify = credential_verifier(store.load_certificate(ca_dir / "ca.crt"))
    pem = (store.issue(ca_dir, "collaborator", "hospital-a")).read_bytes()
    key = store.load_private_key(ca_dir / "hospital-a.key")
    public = verify("hospital-a", pem)
    assert identity.is_valid_signature(public, identity.sign(key, b"keys"), b"keys")
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    assert verify("hospital-a", der) == public
    with pytest.raises(identity.IdentityError, match="another party"):
        verify("hospital-b", pem)
    with pytest.raises(identity.IdentityError):
        verify("hospital-a", identity.public_key_bytes(key))  # a bare key is not a certificate
    other = tmp_path / "other"
    store.init_ca(other)
    with pytest.raises(identity.IdentityError, match="does not verify"):
        verify("hospital-a", store.issue(other, "collaborator", "hospital-a").read_bytes())
