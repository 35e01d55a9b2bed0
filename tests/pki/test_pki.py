"""The federation PKI: CA, requests, signing, verification, files and the `fedfair pki` command."""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedfair import pki
from fedfair.core.errors import ConfigError
from fedfair.pki import identity


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture()
def ca_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "ca"
    pki.init_ca(directory)
    return directory


def request_with_key(name: str, key) -> x509.CertificateSigningRequest:  # type: ignore[no-untyped-def]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())


def test_init_makes_a_p256_ca_with_a_private_key(ca_dir: Path) -> None:
    certificate = pki.load_certificate(ca_dir / "ca.crt")
    assert mode(ca_dir / "ca.key") == 0o600
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    assert certificate.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert isinstance(certificate.public_key().curve, ec.SECP256R1)
    assert isinstance(certificate.signature_hash_algorithm, hashes.SHA256)
    with pytest.raises(ConfigError, match="already has a CA"):
        pki.init_ca(ca_dir)


def test_request_and_sign_flow_keeps_the_key_at_the_institution(ca_dir: Path, tmp_path: Path) -> None:
    institution = tmp_path / "hospital"
    key_path, csr_path = pki.request_certificate(institution, "hospital-a")
    assert mode(key_path) == 0o600 and key_path.parent == institution
    assert pki.check_request(pki.load_request(csr_path)) == "hospital-a"

    cert_path = pki.sign_certificate(ca_dir, csr_path, "collaborator")
    assert cert_path == ca_dir / "hospital-a.crt"
    assert not (ca_dir / "hospital-a.key").exists()  # only the request travelled
    certificate = pki.load_certificate(cert_path)
    ca_certificate = pki.load_certificate(ca_dir / "ca.crt")
    assert pki.verify_certificate(certificate, ca_certificate, "collaborator") == "hospital-a"
    assert pki.name_from_certificate(certificate) == "hospital-a"
    # The certificate certifies the institution's own key.
    assert certificate.public_key() == pki.load_private_key(key_path).public_key()

    with pytest.raises(ConfigError, match="already exists"):
        pki.sign_certificate(ca_dir, csr_path, "collaborator")
    assert pki.sign_certificate(ca_dir, csr_path, "collaborator", overwrite=True) == cert_path
    with pytest.raises(ConfigError, match="already exists"):
        pki.request_certificate(institution, "hospital-a")


def test_role_key_usages(ca_dir: Path) -> None:
    ca_certificate = pki.load_certificate(ca_dir / "ca.crt")
    aggregator = pki.load_certificate(
        pki.issue(ca_dir, "aggregator", "aggregator", hosts=["agg.example.org", "10.0.0.5"])
    )
    collaborator = pki.load_certificate(pki.issue(ca_dir, "collaborator", "hospital-b"))
    assert mode(ca_dir / "aggregator.key") == 0o600 and mode(ca_dir / "hospital-b.key") == 0o600
    assert not (ca_dir / "hospital-b.csr").exists()

    for certificate, usage in (
        (aggregator, ExtendedKeyUsageOID.SERVER_AUTH),
        (collaborator, ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        assert list(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [usage]
        key_usage = certificate.extensions.get_extension_for_class(x509.KeyUsage)
        assert key_usage.critical and key_usage.value.digital_signature and not key_usage.value.key_cert_sign
        assert not certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert isinstance(certificate.signature_hash_algorithm, hashes.SHA256)

    sans = aggregator.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["aggregator", "localhost", "agg.example.org"]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.0.0.5"),
    ]
    assert collaborator.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    ) == ["hospital-b"]

    assert pki.role_of_certificate(aggregator) == "aggregator"
    assert pki.role_of_certificate(collaborator) == "collaborator"
    assert pki.verify_certificate(aggregator, ca_certificate, "aggregator") == "aggregator"
    with pytest.raises(pki.CertificateError, match="collaborator role"):
        pki.verify_certificate(aggregator, ca_certificate, "collaborator")
    with pytest.raises(pki.CertificateError, match="aggregator role"):
        pki.verify_certificate(collaborator, ca_certificate, "aggregator")


def test_sign_refuses_a_request_with_a_wrong_key_type(ca_dir: Path) -> None:
    ca_certificate = pki.load_certificate(ca_dir / "ca.crt")
    ca_key = pki.load_private_key(ca_dir / "ca.key")
    for key in (
        ec.generate_private_key(ec.SECP384R1()),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    ):
        with pytest.raises(pki.CertificateError, match="P-256"):
            pki.sign_request(request_with_key("hospital-a", key), ca_certificate, ca_key, "collaborator")


def test_sign_refuses_a_request_with_a_bad_signature(ca_dir: Path, tmp_path: Path) -> None:
    _, csr_path = pki.request_certificate(tmp_path / "hospital", "hospital-a")
    der = bytearray(pki.load_request(csr_path).public_bytes(serialization.Encoding.DER))
    der[-1] ^= 0x01  # the last byte of the ECDSA signature's s value
    tampered = tmp_path / "tampered.csr"
    tampered.write_bytes(x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM))
    with pytest.raises(pki.CertificateError, match="signature does not verify"):
        pki.sign_certificate(ca_dir, tampered, "collaborator")
    assert not (ca_dir / "hospital-a.crt").exists()


@pytest.mark.parametrize("name", ["Hospital-A", "hospital_a", "-hospital", "hospital a", "", "ca", "a" * 64, "x..y"])
def test_bad_names_are_refused(ca_dir: Path, name: str) -> None:
    with pytest.raises(ConfigError):
        pki.validate_name(name)
    request = request_with_key(name or "x", identity.generate_identity_key()) if name else None
    if request is not None:
        ca_certificate = pki.load_certificate(ca_dir / "ca.crt")
        with pytest.raises(ConfigError):
            pki.sign_request(request, ca_certificate, pki.load_private_key(ca_dir / "ca.key"), "collaborator")


def test_good_names_are_accepted() -> None:
    for name in ("hospital-a", "a", "agg.example.org", "site-01", "0bank"):
        assert pki.validate_name(name) == name


def test_verify_refuses_a_certificate_from_another_ca(ca_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    pki.init_ca(other)
    foreign = pki.load_certificate(pki.issue(other, "collaborator", "hospital-a"))
    ca_certificate = pki.load_certificate(ca_dir / "ca.crt")
    with pytest.raises(pki.CertificateError, match="does not verify"):
        pki.verify_certificate(foreign, ca_certificate, "collaborator")


def test_verify_refuses_a_certificate_outside_its_validity_window(ca_dir: Path) -> None:
    ca_certificate = pki.load_certificate(ca_dir / "ca.crt")
    ca_key = pki.load_private_key(ca_dir / "ca.key")
    request = pki.create_request("hospital-a", pki.generate_private_key())
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    expired = pki.sign_request(request, ca_certificate, ca_key, "collaborator", days=5, not_before=past)
    with pytest.raises(pki.CertificateError, match="does not verify"):
        pki.verify_certificate(expired, ca_certificate, "collaborator")
    fresh = pki.sign_request(request, ca_certificate, ca_key, "collaborator", days=30)
    assert pki.verify_certificate(fresh, ca_certificate, "collaborator") == "hospital-a"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=31)
    with pytest.raises(pki.CertificateError, match="does not verify"):
        pki.verify_certificate(fresh, ca_certificate, "collaborator", now=later)
    future = pki.sign_request(request, ca_certificate, ca_key, "collaborator", not_before=later)
    with pytest.raises(pki.CertificateError, match="does not verify"):
        pki.verify_certificate(future, ca_certificate, "collaborator")


def test_keys_readable_by_others_are_refused(ca_dir: Path) -> None:
    key_path = ca_dir / "ca.key"
    os.chmod(key_path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        pki.load_private_key(key_path)


def test_missing_files_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        pki.load_certificate(tmp_path / "nope.crt")
    with pytest.raises(ConfigError, match="pki init"):
        pki.issue(tmp_path, "collaborator", "hospital-a")
    assert not (tmp_path / "hospital-a.key").exists()  # no stray key without a CA
    with pytest.raises(ConfigError, match="unknown role"):
        pki.issue(tmp_path, "admin", "hospital-a")


def test_credential_verifier_for_secure_aggregation(ca_dir: Path, tmp_path: Path) -> None:
    verify = pki.credential_verifier(pki.load_certificate(ca_dir / "ca.crt"))
    pem = (pki.issue(ca_dir, "collaborator", "hospital-a")).read_bytes()
    key = pki.load_private_key(ca_dir / "hospital-a.key")
    public = verify("hospital-a", pem)
    assert identity.is_valid_signature(public, identity.sign(key, b"keys"), b"keys")
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    assert verify("hospital-a", der) == public
    with pytest.raises(identity.IdentityError, match="another party"):
        verify("hospital-b", pem)
    with pytest.raises(identity.IdentityError):
        verify("hospital-a", identity.public_key_bytes(key))  # a bare key is not a certificate
    other = tmp_path / "other"
    pki.init_ca(other)
    with pytest.raises(identity.IdentityError, match="does not verify"):
        verify("hospital-a", pki.issue(other, "collaborator", "hospital-a").read_bytes())


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="fedfair")
    pki.register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return int(args.handler(args))


def test_cli_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca, site = tmp_path / "ca", tmp_path / "site"
    assert run_cli("pki", "init", "--dir", str(ca)) == 0
    assert run_cli("pki", "issue", "--dir", str(ca), "--role", "aggregator", "--name", "aggregator") == 0
    assert run_cli("pki", "request", "--dir", str(site), "--name", "hospital-a") == 0
    assert (
        run_cli("pki", "sign", "--dir", str(ca), "--csr", str(site / "hospital-a.csr"), "--role", "collaborator") == 0
    )
    assert run_cli("pki", "show", "--dir", str(ca)) == 0
    out = capsys.readouterr().out
    assert "aggregator" in out and "hospital-a" in out and "valid" in out and "INVALID" not in out
    assert mode(site / "hospital-a.key") == 0o600 and (ca / "hospital-a.crt").exists()
    with pytest.raises(ConfigError, match="already exists"):
        run_cli("pki", "init", "--dir", str(ca))
