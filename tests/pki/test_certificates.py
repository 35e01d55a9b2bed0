"""Making certificates: the CA's signing requests and the certificates it issues for each role."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from fedfair.core.errors import CertificateError
from fedfair.pki import store
from fedfair.pki.certificates import create_request, generate_private_key, requested_role, sign_request
from fedfair.pki.verification import role_of_certificate, verify_certificate
from tests.pki.helpers import mode, request_with_key


def test_role_key_usages(ca_dir: Path) -> None:
    ca_certificate = store.load_certificate(ca_dir / "ca.crt")
    aggregator = store.load_certificate(
        store.issue(ca_dir, "aggregator", "aggregator", hosts=["agg.example.org", "10.0.0.5"])
    )
    collaborator = store.load_certificate(store.issue(ca_dir, "collaborator", "hospital-b"))
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

    assert role_of_certificate(aggregator) == "aggregator"
    assert role_of_certificate(collaborator) == "collaborator"
    assert verify_certificate(aggregator, ca_certificate, "aggregator") == "aggregator"
    with pytest.raises(CertificateError, match="collaborator role"):
        verify_certificate(aggregator, ca_certificate, "collaborator")
    with pytest.raises(CertificateError, match="aggregator role"):
        verify_certificate(collaborator, ca_certificate, "aggregator")


def test_sign_refuses_a_request_with_a_wrong_key_type(ca_dir: Path) -> None:
    ca_certificate = store.load_certificate(ca_dir / "ca.crt")
    ca_key = store.load_private_key(ca_dir / "ca.key")
    for key in (
        ec.generate_private_key(ec.SECP384R1()),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    ):
        with pytest.raises(CertificateError, match="P-256"):
            sign_request(request_with_key("hospital-a", key), ca_certificate, ca_key, "collaborator")


def test_sign_refuses_a_request_with_a_bad_signature(ca_dir: Path, tmp_path: Path) -> None:
    _, csr_path = store.request_certificate(tmp_path / "hospital", "hospital-a")
    der = bytearray(store.load_request(csr_path).public_bytes(serialization.Encoding.DER))
    der[-1] ^= 0x01  # the last byte of the ECDSA signature's s value
    tampered = tmp_path / "tampered.csr"
    tampered.write_bytes(x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM))
    with pytest.raises(CertificateError, match="signature does not verify"):
        store.sign_certificate(ca_dir, tampered, "collaborator")
    assert not (ca_dir / "hospital-a.crt").exists()


def test_a_request_carries_the_role_the_institution_asks_for(ca_dir: Path) -> None:
    ca_certificate = store.load_certificate(ca_dir / "ca.crt")
    ca_key = store.load_private_key(ca_dir / "ca.key")
    asked = create_request("hospital-a", generate_private_key(), "collaborator")
    assert requested_role(asked) == "collaborator"
    assert requested_role(create_request("hospital-a", generate_private_key())) is None
    # The CA signs for the role asked for; naming the same role is fine, another one is refused.
    assert role_of_certificate(sign_request(asked, ca_certificate, ca_key)) == "collaborator"
    assert role_of_certificate(sign_request(asked, ca_certificate, ca_key, "collaborator")) == "collaborator"
    with pytest.raises(CertificateError, match="asks for the collaborator role, not aggregator"):
        sign_request(asked, ca_certificate, ca_key, "aggregator")
    # A request without a role needs the CA to name one.
    with pytest.raises(CertificateError, match="names no role"):
        sign_request(create_request("hospital-a", generate_private_key()), ca_certificate, ca_key)


@pytest.mark.parametrize(
    "usages",
    [
        (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),  # both roles
        (ExtendedKeyUsageOID.CODE_SIGNING,),  # neither
        (ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.CODE_SIGNING),  # a role and something else
    ],
)
def test_sign_refuses_a_request_with_a_malformed_role(ca_dir: Path, usages: tuple[x509.ObjectIdentifier, ...]) -> None:
    ca_certificate = store.load_certificate(ca_dir / "ca.crt")
    ca_key = store.load_private_key(ca_dir / "ca.key")
    request = request_with_key("hospital-a", generate_private_key(), usages)
    with pytest.raises(CertificateError, match="asks for a role other than exactly one of aggregator, collaborator"):
        sign_request(request, ca_certificate, ca_key, "collaborator")
