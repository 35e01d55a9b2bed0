"""`fedfair pki init | request | sign | issue | show | manifest` end to end in temporary folders."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.pki import store
from fedfair.cli.pki import register_commands
from fedfair.pki.verification import (
    fingerprint,
    role_of_certificate,
    verify_certificate,
)
from tests.pki.helpers import mode


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="fedfair")
    register_commands(parser.add_subparsers(dest="command", required=True))
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


def test_a_ca_held_elsewhere_signs_requests_and_the_manifest_pins_what_it_issued(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca, operator = tmp_path / "ca", tmp_path / "operator"
    sites = {name: tmp_path / name for name in ("hospital-a", "hospital-b")}
    assert run_cli("pki", "init", "--dir", str(ca)) == 0
    # Each institution makes its key and a request; only the request travels.
    for name, site in sites.items():
        assert run_cli("pki", "request", "--name", name, "--role", "collaborator", "--out", str(site)) == 0
    assert run_cli("pki", "request", "--name", "aggregator", "--role", "aggregator", "--out", str(operator)) == 0
    # The CA holder signs each request for the role it asks for, and hands the certificate back.
    for name, site in [*sites.items(), ("aggregator", operator)]:
        request, out = str(site / f"{name}.csr"), str(site / f"{name}.crt")
        assert run_cli("pki", "sign", "--ca", str(ca), "--csr", request, "--days", "30", "--out", out) == 0
    ca_certificate = store.load_certificate(ca / "ca.crt")
    for name, site in sites.items():
        certificate = store.load_certificate(site / f"{name}.crt")
        assert verify_certificate(certificate, ca_certificate, "collaborator") == name
        assert certificate.public_key() == store.load_private_key(site / f"{name}.key").public_key()
        assert not (ca / f"{name}.key").exists() and mode(site / f"{name}.key") == 0o600
    assert role_of_certificate(store.load_certificate(operator / "aggregator.crt")) == "aggregator"
    capsys.readouterr()

    manifest = tmp_path / "manifest.toml"
    folders = [str(folder) for folder in (operator, *sites.values())]
    argv = ["pki", "manifest", "--federation", "fedfair-demo", "--certs", *folders, "--ca", str(ca / "ca.crt")]
    assert run_cli(*argv, "--min-round-size", "2", "--out", str(manifest)) == 0
    out = capsys.readouterr().out
    document = tomllib.loads(manifest.read_text())
    assert document["federation"] == {"id": "fedfair-demo", "max_colluding": 0, "min_round_size": 2}
    pinned = {entry["name"]: entry for entry in document["participants"]}
    for name, site in [*sites.items(), ("aggregator", operator)]:
        # The printed fingerprint is the pinned one, which is the certificate's: compare it out of band.
        sha256 = fingerprint(store.load_certificate(site / f"{name}.crt"))
        assert pinned[name]["sha256"] == sha256 and sha256 in out
    assert "manifest sha256 " in out
    with pytest.raises(ConfigError, match="already exists"):
        run_cli(*argv, "--min-round-size", "2", "--out", str(manifest))
    with pytest.raises(ConfigError, match="min_round_size = 3 exceeds the 2 collaborators"):
        run_cli(*argv, "--min-round-size", "3", "--out", str(tmp_path / "other.toml"))
    assert not (tmp_path / "other.toml").exists()


def test_sign_refuses_a_request_for_another_role_and_writes_nothing(tmp_path: Path) -> None:
    ca, site = tmp_path / "ca", tmp_path / "site"
    run_cli("pki", "init", "--dir", str(ca))
    run_cli("pki", "request", "--name", "hospital-a", "--out", str(site))  # collaborator by default
    csr = str(site / "hospital-a.csr")
    with pytest.raises(ConfigError, match="asks for the collaborator role, not aggregator"):
        run_cli("pki", "sign", "--ca", str(ca), "--csr", csr, "--role", "aggregator")
    with pytest.raises(ConfigError, match="--days must be at least 1"):
        run_cli("pki", "sign", "--ca", str(ca), "--csr", csr, "--days", "0")
    assert sorted(path.name for path in ca.iterdir()) == ["ca.crt", "ca.key"]


def test_issue_with_zero_days_leaves_nothing_behind(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    run_cli("pki", "init", "--dir", str(ca))
    with pytest.raises(ConfigError, match="--days must be at least 1"):
        run_cli("pki", "issue", "--dir", str(ca), "--role", "collaborator", "--name", "hospital-a", "--days", "0")
    assert sorted(path.name for path in ca.iterdir()) == ["ca.crt", "ca.key"]
