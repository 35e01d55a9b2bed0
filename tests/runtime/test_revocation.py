"""Revoking a site's certificate with a new manifest (`fedfair pki revoke`): what the manifest no longer pins
is refused at the aggregator's handshake and in every peer's key agreement, and no ledger is reset
(issue 51, item 5). Over loopback mutual TLS: the aggregator and the revoked key's holder are processes (an
exit status and console lines are what is refused), the institutions that take part `Collaborator`s in
threads of the test, sparing three process start-ups."""

from __future__ import annotations

import dataclasses
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.cli import main as cli_main
from fedfair.core.errors import ConfigError, IdentityError
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.manifest import load_manifest, pinned_verifier, revoked
from tests.runtime.harness import Processes, plan_sections

NAMES = ["site-a", "site-b", "site-c"]
REVOKED = "site-c"


def new_certificate(workspace: Workspace, folder: Path) -> Path:
    """The revoked institution's new key and certificate, through the CLI: it requests, the CA holder signs."""
    assert cli_main(["pki", "request", "--dir", str(folder), "--name", REVOKED]) == 0
    certificate = folder / f"{REVOKED}.crt"
    csr = ["--csr", str(folder / f"{REVOKED}.csr"), "--out", str(certificate)]
    assert cli_main(["pki", "sign", "--ca", str(workspace.certs), *csr]) == 0
    shutil.copy(workspace.certs / "ca.crt", folder / "ca.crt")
    return certificate


def config_copy(workspace: Workspace, folder: Path, **lines: str) -> Path:
    """The revoked site's collaborator.toml in `folder`, with some `key = value` lines replaced."""
    text = workspace.configs[REVOKED].read_text()
    for key, value in lines.items():
        text = "\n".join(f"{key} = {value}" if line.startswith(f"{key} = ") else line for line in text.splitlines())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "collaborator.toml"
    path.write_text(text + "\n")
    return path


@pytest.mark.slow
def test_a_revoked_certificate_is_refused_at_the_handshake_while_its_replacement_takes_part(
    tmp_path: Path, processes: Processes, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = make_workspace(
        tmp_path, NAMES, plan=plan_sections(training={"rounds": 1}, quorum={"min_collaborators": 3}), manifest=True
    )
    manifest = tmp_path / "manifest.toml"
    shutil.copy(manifest, tmp_path / "manifest-old.toml")
    certificate = new_certificate(workspace, tmp_path / REVOKED / "new-certs")
    revoke = ["pki", "revoke", "--manifest", str(manifest), "--name", REVOKED, "--replace", str(certificate)]
    assert cli_main([*revoke, "--out", str(tmp_path / "manifest-2.toml")]) == 0
    assert "the plan stays pinned" in capsys.readouterr().out
    os.replace(tmp_path / "manifest-2.toml", manifest)  # every institution puts the new manifest in place

    aggregator = processes.aggregator(workspace)
    # Whoever holds the revoked key (and the old manifest, which still pins it) is refused by the aggregator:
    # the CA signed the certificate and the name is allowed, but the manifest in force pins another one.
    stolen = config_copy(workspace, tmp_path / "stolen", manifest=f'"{tmp_path / "manifest-old.toml"}"')
    refused = processes.collaborator(dataclasses.replace(workspace, configs={REVOKED: stolen}), REVOKED)
    assert refused.wait(120) != 0, processes.tail()
    said = "\n".join(refused.lines)
    assert "certificate-revoked" in said and "revoked it" in said, said
    # The institution itself, on its new certificate, takes part with the others and the federation finishes.
    renewed = config_copy(workspace, tmp_path / REVOKED, dir=f'"{tmp_path / REVOKED / "new-certs"}"')
    configs = {**workspace.configs, REVOKED: renewed}
    collaborators = {name: Collaborator(load_collaborator_config(path)) for name, path in configs.items()}
    with ThreadPoolExecutor(max_workers=len(collaborators), thread_name_prefix="test-collaborator") as pool:
        try:
            statuses = {name: pool.submit(collaborator.run) for name, collaborator in collaborators.items()}
            processes.finish(aggregator)
            assert {name: status.result(timeout=60) for name, status in statuses.items()} == dict.fromkeys(NAMES, 0)
        finally:
            for collaborator in collaborators.values():
                collaborator.stop()

    # Every peer's key agreement refuses the revoked certificate relayed for the name, and takes the new one.
    verify = pinned_verifier(load_manifest(manifest), pki.load_certificate(workspace.certs / "ca.crt"))
    old = pki.load_certificate(workspace.certs / f"{REVOKED}.crt").public_bytes(serialization.Encoding.DER)
    with pytest.raises(IdentityError, match="was revoked in the federation's manifest"):
        verify(REVOKED, old)
    verify(REVOKED, pki.load_certificate(certificate).public_bytes(serialization.Encoding.DER))


def test_removing_a_site_drops_its_pin_and_the_plan_pin_and_checks_the_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = make_workspace(tmp_path, NAMES, plan=plan_sections(quorum={"min_collaborators": 3}), manifest=True)
    manifest = load_manifest(tmp_path / "manifest.toml")
    revoke = ["pki", "revoke", "--manifest", str(manifest.source), "--name", REVOKED, "--out", str(tmp_path / "r.toml")]
    assert cli_main(revoke) == 2
    assert "min_round_size = 3 exceeds the 2 collaborators" in capsys.readouterr().err
    assert cli_main([*revoke, "--min-round-size", "2"]) == 0
    assert "2 collaborators left, min_round_size 2; no plan pinned" in capsys.readouterr().out
    written = load_manifest(tmp_path / "r.toml")
    assert written.collaborator_names == {"site-a", "site-b"} and written.plan is None
    with pytest.raises(ConfigError, match=r"without 'site-c': min_round_size = 3 exceeds the 2 collaborators"):
        revoked(manifest, REVOKED)
    removed = revoked(manifest, REVOKED, min_round_size=2)
    assert removed.collaborator_names == {"site-a", "site-b"} and removed.plan is None
    with pytest.raises(ConfigError, match="'site-x' is not a collaborator"):
        revoked(manifest, "site-x")
    verify = pinned_verifier(removed, pki.load_certificate(workspace.certs / "ca.crt"))
    old = pki.load_certificate(workspace.certs / f"{REVOKED}.crt").public_bytes(serialization.Encoding.DER)
    with pytest.raises(IdentityError, match="is not in the federation's manifest"):
        verify(REVOKED, old)


def test_a_revoked_certificate_is_never_pinned_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`pki revoke` lists the fingerprint; `pki manifest --previous` carries the list and refuses the certificate,
    whose folder still holds it, until the site's replacement is there; a hand-edited pin of it is refused too."""
    workspace = make_workspace(tmp_path, NAMES, plan=plan_sections(quorum={"min_collaborators": 2}), manifest=True)
    old = pki.fingerprint(pki.load_certificate(workspace.certs / f"{REVOKED}.crt"))
    revoke = ["pki", "revoke", "--manifest", str(tmp_path / "manifest.toml"), "--name", REVOKED]
    assert cli_main([*revoke, "--min-round-size", "2", "--out", str(tmp_path / "r.toml")]) == 0
    assert load_manifest(tmp_path / "r.toml").revoked == (old,)
    capsys.readouterr()
    again = ["pki", "manifest", "--federation", "fed", "--certs", str(workspace.certs), "--min-round-size", "2"]
    assert cli_main([*again, "--previous", str(tmp_path / "r.toml"), "--out", str(tmp_path / "again.toml")]) == 2
    assert f"'{REVOKED}' (sha256 {old}) was revoked in this federation" in capsys.readouterr().err
    assert not (tmp_path / "again.toml").exists()
    # Without --previous the command cannot know; it says so.
    assert cli_main([*again, "--out", str(tmp_path / "blind.toml")]) == 0
    assert "if an earlier manifest revoked one, pass it with --previous" in capsys.readouterr().out
    # The replacement takes the name; the revoked list stays in the digest the institutions compare.
    (workspace.certs / f"{REVOKED}.crt").unlink()
    assert cli_main([*again, "--previous", str(tmp_path / "r.toml"), "--out", str(tmp_path / "next.toml")]) == 0
    assert "1 revoked certificate(s) carried over" in capsys.readouterr().out
    assert load_manifest(tmp_path / "next.toml").revoked == (old,)
    pinned_again = (
        tmp_path / "r.toml"
    ).read_text() + f'\n[[participants]]\nname = "{REVOKED}"\nrole = "collaborator"\nsha256 = "{old}"\n'
    (tmp_path / "edited.toml").write_text(pinned_again)
    with pytest.raises(ConfigError, match="was revoked in this federation"):
        load_manifest(tmp_path / "edited.toml")
