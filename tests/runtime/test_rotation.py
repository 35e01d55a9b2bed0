"""A roster update a running federation takes (issue 65): `fedfair pki revoke --replace --sign` writes a manifest
the CA holder signed that names the one it replaces; put in place of the manifest's file it is taken by the
running aggregator at its next round, which names it in that round's tasks, and by every site at that round. The
revoked key takes part in no later round, the re-keyed site carries the federation to its last round under the
first manifest's identity, and a forged update (not the CA holder's, or a broken chain) changes nothing. Over
loopback mutual TLS, the parties in threads of the test."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.cli import main as cli_main
from fedfair.core.errors import IdentityError, ManifestError
from fedfair.pki.roster import pin_certificate
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.failures import EXIT_INCOMPLETE
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.manifest import Manifest, federation_digest, load_manifest, manifest_digest, revoked
from fedfair.runtime.manifest_update import LiveManifest, check_update, signed_update, write_update
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, plan_digest
from tests.runtime.harness import eventually, plan_sections, thread_federation
from tests.runtime.test_revocation import REVOKED, config_copy, new_certificate

NAMES = ["site-a", "site-b", "site-c"]
ROUNDS = 6


def der(path: Path) -> bytes:
    return pki.load_certificate(path).public_bytes(serialization.Encoding.DER)


def signed_rotation(workspace: Workspace, tmp_path: Path) -> tuple[Path, Path]:
    """The CA holder's signed update re-keying site-c (through the CLI), and site-c's new certificate."""
    certificate = new_certificate(workspace, tmp_path / REVOKED / "new-certs")
    update = tmp_path / "manifest-2.toml"
    revoke = ["pki", "revoke", "--manifest", str(tmp_path / "manifest.toml"), "--name", REVOKED]
    revoke += ["--replace", str(certificate), "--sign", str(workspace.certs), "--out", str(update)]
    assert cli_main(revoke) == 0
    return update, certificate


@pytest.mark.slow
def test_a_rotation_mid_run_refuses_the_revoked_key_and_completes_every_round(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Every round needs all three sites: the rounds after the revocation wait for the re-keyed one.
    sections = plan_sections(training={"rounds": ROUNDS}, quorum={"min_collaborators": 3})
    workspace = make_workspace(tmp_path, NAMES, plan=sections, manifest=True)
    first = load_manifest(tmp_path / "manifest.toml")
    digest = plan_digest(load_aggregator_plan(workspace.plan))
    update, certificate = signed_rotation(workspace, tmp_path)
    output = load_aggregator_plan(workspace.plan).aggregator.output
    caplog.set_level(logging.WARNING)
    with thread_federation(workspace) as federation:
        assert eventually(lambda: len(read_round_log(output)) >= 2, 120), federation.errors
        os.replace(update, tmp_path / "manifest.toml")  # every institution and the aggregator: one shared file here
        in_flight = len(read_round_log(output)) + 1
        # The old key's task stream ends with the refusal when the aggregator takes the update.
        assert eventually(lambda: REVOKED in federation.errors, 120), federation.errors
        before_new_key = len(read_round_log(output))
        # An honest site restarted under the updated manifest rejoins the same federation. It is stopped while the
        # aggregator waits for its quorum (site-c's new key), so no round is in flight to lose a survivor.
        federation.collaborators["site-b"].stop()
        assert eventually(lambda: "site-b" in federation.exits, 60), federation.errors
        federation._run("site-b-restarted", Collaborator(load_collaborator_config(workspace.configs["site-b"])).run)
        renewed = config_copy(workspace, tmp_path / REVOKED, dir=f'"{tmp_path / REVOKED / "new-certs"}"')
        federation._run("site-c-new-key", Collaborator(load_collaborator_config(renewed)).run)
        federation.join(240)
    refusal = federation.errors.pop(REVOKED)
    assert not federation.errors, federation.errors
    assert "certificate-revoked" in str(refusal), refusal
    records = read_round_log(output)
    assert [record["round"] for record in records] == list(range(1, ROUNDS + 1))
    # The rotation aborts no round: the update takes effect for every party at the round whose tasks name it, so
    # every round is applied with all three sites, and every site's final model holds every round: exit 0.
    assert [record["round"] for record in records if record["status"] != "applied"] == [], records
    assert all(set(NAMES) <= set(record["contributors"]) for record in records), records
    assert federation.exits == {"site-b": 0, "site-a": 0, "site-c-new-key": 0, "site-b-restarted": 0}, federation.exits
    assert "was revoked in the federation's manifest" in caplog.text
    # The old key took part in no round after the one in flight when the update landed: its stream had ended
    # (the refusal above) before the round after `before_new_key` began, and every later round waited for the
    # new key (all three sites are needed), which contributed to each of them.
    assert before_new_key <= in_flight and before_new_key < ROUNDS
    # The federation's identity is the first manifest's: a restart under the update resumes the same checkpoints.
    now = load_manifest(tmp_path / "manifest.toml")
    assert manifest_digest(now) != manifest_digest(first) and federation_digest(now) == manifest_digest(first)
    assert plan_digest(load_aggregator_plan(workspace.plan)) == digest
    ca = pki.load_certificate(workspace.certs / "ca.crt")
    live = LiveManifest(now, ca)
    with pytest.raises(IdentityError, match="was revoked in the federation's manifest"):
        live(REVOKED, der(workspace.certs / f"{REVOKED}.crt"))
    live(REVOKED, der(certificate))


@pytest.mark.slow
def test_a_site_without_the_rounds_manifest_sits_out_and_the_others_complete_the_round(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # site-a reads its own copy of the manifest, which nobody updates: it cannot hold the manifest the rounds
    # after the update name, so it sits them out instead of checking peers under the roster it holds.
    names = [*NAMES, "site-d", "site-e"]
    workspace = make_workspace(tmp_path, names, plan=plan_sections(training={"rounds": 4}), manifest=True)
    stale = tmp_path / "manifest-site-a.toml"
    shutil.copy(tmp_path / "manifest.toml", stale)
    config = workspace.configs["site-a"]
    config.write_text(config.read_text().replace(f'"{tmp_path / "manifest.toml"}"', f'"{stale}"'))
    update, _ = signed_rotation(workspace, tmp_path)
    output = load_aggregator_plan(workspace.plan).aggregator.output
    caplog.set_level(logging.WARNING)
    with thread_federation(workspace) as federation:
        assert eventually(lambda: len(read_round_log(output)) >= 1, 120), federation.errors
        os.replace(update, tmp_path / "manifest.toml")
        # Five sites finish the last rounds in well under a second, before the old key would call again: its
        # refusal is the end of its task stream.
        assert eventually(lambda: REVOKED in federation.errors, 120), federation.errors
        federation.join(240)
    assert "certificate-revoked" in str(federation.errors.pop(REVOKED))
    assert not federation.errors, federation.errors
    records = read_round_log(output)
    # No round is lost: site-a takes part until the rounds name the update, then sits out every one of them, and
    # the other sites (not the revoked key) complete them.
    assert [(record["round"], record["status"]) for record in records] == [(n, "applied") for n in range(1, 5)]
    taken = next(n for n, record in enumerate(records) if "site-a" not in record["contributors"])
    assert taken >= 1 and all("site-a" in record["contributors"] for record in records[:taken]), records
    assert all(set(record["contributors"]) == {"site-b", "site-d", "site-e"} for record in records[taken:]), records
    assert f"site-a: sitting out round {taken + 1}: it runs under manifest" in caplog.text
    assert f"which {stale} does not hold" in caplog.text
    assert federation.exits["site-b"] == federation.exits["site-d"] == federation.exits["site-e"] == 0
    assert federation.exits["site-a"] == EXIT_INCOMPLETE, federation.exits


def test_a_forged_update_is_refused_with_its_reason_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = make_workspace(tmp_path, NAMES, plan=plan_sections(quorum={"min_collaborators": 2}), manifest=True)
    path = tmp_path / "manifest.toml"
    held = load_manifest(path)
    ca = pki.load_certificate(workspace.certs / "ca.crt")
    live = LiveManifest(held, ca)
    old_key = der(workspace.certs / f"{REVOKED}.crt")
    live(REVOKED, old_key)  # accepted, and remembered
    certificate = new_certificate(workspace, tmp_path / REVOKED / "new-certs")
    replacement = pin_certificate(pki.load_certificate(certificate), ca)
    rekeyed = dataclasses.replace(revoked(held, REVOKED, replacement), source=path)
    thief_key = pki.load_private_key(workspace.certs / "site-a.key")  # a site's key, not the CA holder's
    ca_key = pki.load_private_key(workspace.certs / "ca.key")
    cases = {
        "not signed by the federation's CA holder": signed_update(held, rekeyed, thief_key),
        "a broken chain": signed_update(rekeyed, rekeyed, ca_key),
        "is not a signed update": rekeyed,
        # The CA holder may re-key a site, not change what the institutions agreed on.
        "changes min_round_size, plan; a running federation takes only re-keyed sites": signed_update(
            held, dataclasses.replace(rekeyed, min_round_size=3, plan=None), ca_key
        ),
    }
    for message, forged in cases.items():
        with pytest.raises(ManifestError, match=message):
            check_update(held, dataclasses.replace(forged, source=path), ca)
    caplog.set_level(logging.ERROR)
    for message, forged in ((message, forged) for message, forged in cases.items() if forged.update is not None):
        os.replace(_written(forged, tmp_path / "forged.toml"), path)
        assert live.poll() is None and message in caplog.text
        assert live.current is held
        live(REVOKED, old_key)  # still accepted: nothing changed


def _written(manifest: Manifest, path: Path) -> Path:
    path.unlink(missing_ok=True)
    write_update(path, manifest)
    return path


def test_sign_writes_an_update_only_for_a_re_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workspace = make_workspace(tmp_path, NAMES, plan=plan_sections(quorum={"min_collaborators": 2}), manifest=True)
    revoke = ["pki", "revoke", "--manifest", str(tmp_path / "manifest.toml"), "--name", REVOKED]
    assert cli_main([*revoke, "--sign", str(workspace.certs), "--out", str(tmp_path / "u.toml")]) == 2
    assert "--sign writes an update a running federation takes, which only re-keys a site" in capsys.readouterr().err
    assert not (tmp_path / "u.toml").exists()
    update, _ = signed_rotation(workspace, tmp_path)
    assert "signed by the CA holder as the update of manifest" in capsys.readouterr().out
    held = load_manifest(tmp_path / "manifest.toml")
    check_update(held, load_manifest(update), pki.load_certificate(workspace.certs / "ca.crt"))
    # A party holding the manifest it read at start takes an update already in place at its first look.
    os.replace(update, tmp_path / "manifest.toml")
    live = LiveManifest(held, pki.load_certificate(workspace.certs / "ca.crt"))
    assert live.poll() is not None and federation_digest(live.current) == manifest_digest(held)


def test_a_site_takes_an_update_at_the_round_that_names_it_not_when_its_file_lands(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = make_workspace(tmp_path, NAMES, plan=plan_sections(quorum={"min_collaborators": 2}), manifest=True)
    held = load_manifest(tmp_path / "manifest.toml")
    ca = pki.load_certificate(workspace.certs / "ca.crt")
    live = LiveManifest(held, ca)
    update, certificate = signed_rotation(workspace, tmp_path)
    new = manifest_digest(load_manifest(update))
    caplog.set_level(logging.ERROR)
    # The round in flight names the manifest held: the update in place waits, the old key still verifies.
    assert live.settle(new) is False and "put the CA-signed update in place" in caplog.text
    os.replace(update, tmp_path / "manifest.toml")
    assert live.settle(manifest_digest(held)) is True and live.current is held
    live(REVOKED, der(workspace.certs / f"{REVOKED}.crt"))
    # The next round names the update: taken, and from then the old key is refused, the new one verifies.
    assert live.settle(new) is True and manifest_digest(live.current) == new
    with pytest.raises(IdentityError, match="was revoked in the federation's manifest"):
        live(REVOKED, der(workspace.certs / f"{REVOKED}.crt"))
    live(REVOKED, der(certificate))
    assert live.settle("") is True and manifest_digest(live.current) == new  # an aggregator without a manifest
