"""`fedfair pki init | request | sign | issue | show` end to end in temporary folders."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.pki.commands import register_commands
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
