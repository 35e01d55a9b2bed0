"""The two-verifier input bound as a plan declares it (issue 80): its keys, its auditor, the manifest that pins both.

Every refusal names the problem and the fix; the auditor is an institution of its own in the manifest, with a
certificate of the federation's CA for the auditor role; a plan that declares the mode loads under a manifest
that pins its auditor.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from fedfair import cli
from fedfair.core.errors import ConfigError, ManifestError
from fedfair.pki import store
from fedfair.pki.roster import PlanPin, Roster, pin_certificate, pins_from_folders, settings_digest, write_manifest
from fedfair.pki.verification import role_of_certificate, verify_certificate
from fedfair.runtime import manifest as manifests
from fedfair.runtime import manifest_plan, manifest_update
from fedfair.runtime.plan import aggregator_plan as plan
from fedfair.runtime.plan.input_bound import TWO_VERIFIERS, input_bound_line, prepare_verification
from tests.runtime.test_manifest import COLLABORATORS, aggregator_plan_with
from tests.runtime.test_plan import NO_NOISE, PLAN_TEMPLATE, aggregator_plan

AUDITOR = "audit-co"
ON = {"input_bound": TWO_VERIFIERS, "auditor": AUDITOR}


@pytest.fixture()
def federation(tmp_path: Path) -> Path:
    """The template's federation with an auditor institution: its own key, a certificate for the auditor role."""
    ca = tmp_path / "ca"
    store.init_ca(ca)
    store.issue(ca, "aggregator", "aggregator")
    for name in COLLABORATORS:
        _, request = store.request_certificate(tmp_path / name, name, "collaborator")
        store.sign_certificate(ca, request)
    _, request = store.request_certificate(tmp_path / AUDITOR, AUDITOR, "auditor")
    store.sign_certificate(ca, request)
    write_manifest(tmp_path / "manifest.toml", Roster("fedfair-demo", tuple(pins_from_folders([ca])), 0, 2))
    return tmp_path


# ---------------------------------------------------------------- the plan's keys


CLEAR = {"privacy": NO_NOISE, "quorum": {"min_collaborators": 1}}
"""What a plan with secure aggregation off needs besides (no noise inside a sum, a quorum of one)."""


@pytest.mark.parametrize(
    ("secure", "message"),
    [
        ({"input_bound": "bounded"}, r'input_bound = "bounded" is not known'),
        ({"input_bound": TWO_VERIFIERS}, r"needs its second verifier: add auditor = \"NAME\""),
        ({"auditor": AUDITOR}, r"auditor = \"audit-co\" is named but input_bound is \"none\""),
        ({**ON, "enabled": False}, r"enabled = false sends them in the clear; turn enabled back on"),
        ({**ON, "auditor": "Audit Co"}, r"auditor: invalid participant name 'Audit Co'"),
        ({**ON, "auditor": "aggregator"}, r"auditor = 'aggregator' is the aggregator; .* name another institution"),
        ({**ON, "auditor": "hospital-b"}, r"auditor = 'hospital-b' is a collaborator; .* does not train"),
        (ON, r"auditor = 'audit-co' must be an institution the manifest pins, but the plan names no manifest"),
    ],
)
def test_every_wrong_declaration_is_refused_naming_the_fix(secure: dict[str, Any], message: str) -> None:
    extra = CLEAR if secure.get("enabled") is False else {}
    with pytest.raises(ConfigError, match=message) as caught:
        aggregator_plan(secure_aggregation=secure, **extra)
    assert str(caught.value).startswith(f"{PLAN_TEMPLATE}: ")


def test_off_by_default_and_absent_from_what_is_shared_and_pinned() -> None:
    loaded = plan.load_aggregator_plan(PLAN_TEMPLATE)
    assert (loaded.secure_aggregation.input_bound, loaded.secure_aggregation.auditor) == ("none", None)
    shared = plan.shared_content(loaded)["secure_aggregation"]
    # Left out when off: every plan keeps the digest its manifest pins and its checkpoints resume under.
    assert "input_bound" not in shared and "auditor" not in shared
    explicit = aggregator_plan(secure_aggregation={"input_bound": "none"})
    assert plan.plan_digest(explicit) == plan.plan_digest(loaded)
    assert input_bound_line(loaded.secure_aggregation).startswith("input bound: none (no site proves its update")


def test_plan_show_states_the_input_bound_in_force(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "show", "--plan", str(PLAN_TEMPLATE)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == input_bound_line(plan.load_aggregator_plan(PLAN_TEMPLATE).secure_aggregation), out


def test_a_party_says_it_compiles_the_arithmetic_before_it_does_and_then_that_it_is_ready(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first time on a machine the compilation is minutes on a busy one: without the first line, a new operator
    saw nothing after "listening" or "connecting" for 98 to 113 s. Without the mode nothing is compiled or said."""
    secure = declared(plan.load_aggregator_plan(PLAN_TEMPLATE)).secure_aggregation
    with caplog.at_level(logging.INFO, logger="fedfair.runtime"):
        prepare_verification(dataclasses.replace(secure, input_bound="none", auditor=None), "hospital-a")
        assert caplog.records == []
        prepare_verification(secure, "hospital-a")
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("hospital-a: compiling the bounded sum's arithmetic before the first round (the first")
    assert said[1].startswith("hospital-a: the bounded sum's arithmetic is ready (compiled or loaded in ")


def declared(loaded: plan.AggregatorPlan) -> plan.AggregatorPlan:
    """`loaded` declaring the mode, as a plan will load once the round carries the proof."""
    return dataclasses.replace(loaded, secure_aggregation=dataclasses.replace(loaded.secure_aggregation, **ON))


def test_the_mode_and_its_auditor_are_shared_and_inside_the_pinned_digest() -> None:
    off = plan.load_aggregator_plan(PLAN_TEMPLATE)
    on = declared(off)
    content = plan.shared_content(on)
    assert {key: content["secure_aggregation"][key] for key in ON} == ON
    assert settings_digest(content) != settings_digest(plan.shared_content(off))
    assert plan.plan_digest(on) != plan.plan_digest(off)
    # A collaborator reads them back from what the aggregator serves.
    received = plan.load_shared_settings(plan.shared_settings(on)).secure_aggregation
    assert (received.input_bound, received.auditor) == (TWO_VERIFIERS, AUDITOR)
    line = input_bound_line(received)
    assert "two verifiers, the aggregator and auditor 'audit-co'" in line and "must not collude" in line


def test_a_declaring_plan_loads_under_a_manifest_that_pins_its_auditor(federation: Path) -> None:
    loaded = aggregator_plan_with(federation, secure_aggregation=ON)
    assert (loaded.secure_aggregation.input_bound, loaded.secure_aggregation.auditor) == (TWO_VERIFIERS, AUDITOR)
    assert loaded.secure_aggregation.bounds_inputs


# ---------------------------------------------------------------- the manifest's auditor


def test_the_auditors_certificate_chains_to_the_federations_ca_for_its_own_role(federation: Path) -> None:
    ca = store.load_certificate(federation / "ca" / "ca.crt")
    certificate = store.load_certificate(federation / "ca" / f"{AUDITOR}.crt")
    assert role_of_certificate(certificate) == "auditor"
    assert verify_certificate(certificate, ca, "auditor") == AUDITOR
    # Neither passes for the other: an auditor cannot join as a site, nor a site's certificate audit.
    with pytest.raises(ConfigError, match="not issued for the collaborator role"):
        verify_certificate(certificate, ca, "collaborator")
    with pytest.raises(ConfigError, match="not issued for the auditor role"):
        verify_certificate(store.load_certificate(federation / "ca" / "hospital-a.crt"), ca, "auditor")
    # A certificate of another CA is refused like anyone's.
    store.init_ca(federation / "other")
    stranger = store.load_certificate(store.issue(federation / "other", "auditor", AUDITOR))
    with pytest.raises(ConfigError, match="does not verify against this federation's CA"):
        verify_certificate(stranger, ca, "auditor")


def test_the_manifest_lists_the_auditor_apart_and_its_digest_covers_it(federation: Path) -> None:
    loaded = manifests.load_manifest(federation / "manifest.toml")
    assert [pin.name for pin in loaded.auditors] == [AUDITOR] and loaded.pin(AUDITOR) == loaded.auditors[0]
    assert AUDITOR not in loaded.collaborator_names
    assert 'role = "auditor"' in (federation / "manifest.toml").read_text()
    without = dataclasses.replace(loaded, auditors=())
    assert manifests.manifest_digest(without) != manifests.manifest_digest(loaded)
    # A round's roster holds collaborators only: the auditor is no party of the masked sum.
    with pytest.raises(ManifestError, match="'audit-co', not a collaborator"):
        loaded.check_roster(("hospital-a", AUDITOR))


@pytest.mark.parametrize(
    ("auditor", "message"),
    [
        ("audit-2", r"auditor = 'audit-2' is not an institution in the manifest .*role = \"auditor\""),
        ("aggregator", r"auditor = 'aggregator' is the manifest's aggregator, but the second verifier must be"),
        ("hospital-a", r"auditor = 'hospital-a' is the manifest's collaborator, but the second verifier must be"),
    ],
)
def test_the_plans_auditor_must_be_an_auditor_of_the_manifest(federation: Path, auditor: str, message: str) -> None:
    loaded = manifests.load_manifest(federation / "manifest.toml")
    manifest_plan.check_auditor(loaded, AUDITOR, "the plan")
    with pytest.raises(ManifestError, match=message):
        manifest_plan.check_auditor(loaded, auditor, "the plan")


def test_a_collaborator_refuses_shared_settings_naming_an_auditor_its_manifest_does_not_list(
    federation: Path,
) -> None:
    on = declared(aggregator_plan_with(federation))
    served = json.loads(plan.shared_settings(on))
    shared = plan.load_shared_settings(plan.shared_settings(on))
    manifest_plan.check_shared_settings(manifests.load_manifest(federation / "manifest.toml"), shared, served)
    bare = Roster("fedfair-demo", tuple(pins_from_folders([federation / "ca"])), 0, 2)
    bare = dataclasses.replace(bare, pins=tuple(pin for pin in bare.pins if pin.role != "auditor"))
    write_manifest(federation / "no-auditor.toml", bare)
    with pytest.raises(ManifestError, match="auditor = 'audit-co' is not an institution in the manifest"):
        manifest_plan.check_shared_settings(manifests.load_manifest(federation / "no-auditor.toml"), shared, served)
    # The aggregator holds its own plan to the manifest it names before anything else.
    with pytest.raises(ManifestError, match="auditor = 'audit-co' is not an institution in the manifest"):
        aggregator_plan_with(
            federation, aggregator={"manifest": str(federation / "no-auditor.toml")}, secure_aggregation=ON
        )


def test_pki_revoke_removes_an_auditor_no_plan_names_and_refuses_the_one_the_pinned_plan_names(
    federation: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    revoke = ["pki", "revoke", "--manifest", str(federation / "manifest.toml"), "--name", AUDITOR]
    assert cli.main([*revoke, "--out", str(federation / "without.toml")]) == 0
    said = capsys.readouterr().out
    assert "0 auditors left; no plan pinned" in said and "next: pin the plan again" in said, said
    assert manifests.load_manifest(federation / "without.toml").auditors == ()
    held = pinned_naming_the_auditor(federation)
    write_manifest(federation / "pinned.toml", held.roster)
    pinned = ["pki", "revoke", "--manifest", str(federation / "pinned.toml"), "--name", AUDITOR]
    assert cli.main([*pinned, "--out", str(federation / "refused.toml")]) == 2
    assert "is the auditor the pinned plan's" in capsys.readouterr().err
    assert not (federation / "refused.toml").exists()


def pinned_naming_the_auditor(federation: Path) -> manifests.Manifest:
    """The manifest with a plan pinned whose input bound names the auditor."""
    settings = plan.shared_content(declared(aggregator_plan_with(federation)))
    return dataclasses.replace(manifests.load_manifest(federation / "manifest.toml"), plan=PlanPin(settings))


def test_revoking_the_plans_auditor_is_a_named_failure_and_its_replacement_keeps_the_plan(federation: Path) -> None:
    held = pinned_naming_the_auditor(federation)
    assert manifests.pinned_auditor(held) == AUDITOR
    with pytest.raises(ConfigError, match="'audit-co' is the auditor the pinned plan's .* replacement certificate"):
        manifests.revoked(held, AUDITOR)
    _, request = store.request_certificate(federation / "new", AUDITOR, "auditor")
    certificate = store.sign_certificate(federation / "ca", request, out=federation / "new" / f"{AUDITOR}.crt")
    replacement = pin_certificate(
        store.load_certificate(certificate), store.load_certificate(federation / "ca" / "ca.crt")
    )
    rekeyed = manifests.revoked(held, AUDITOR, replacement)
    assert rekeyed.plan == held.plan and rekeyed.auditors == (replacement,)
    assert held.auditors[0].sha256 in rekeyed.revoked
    # A site's certificate cannot replace the auditor's.
    site = dataclasses.replace(replacement, role="collaborator")
    with pytest.raises(ConfigError, match="is for collaborator 'audit-co', not auditor 'audit-co'"):
        manifests.revoked(held, AUDITOR, site)
    # An auditor no plan names may be removed like a site (the plan pin goes, as for any removal).
    unnamed = manifests.load_manifest(federation / "manifest.toml")
    assert manifests.revoked(unnamed, AUDITOR).auditors == ()
    with pytest.raises(ConfigError, match="'aggregator' is not a collaborator or an auditor"):
        manifests.revoked(unnamed, "aggregator")


def test_a_running_federation_takes_a_rekeyed_auditor_but_not_one_removed(federation: Path) -> None:
    ca_folder = federation / "ca"
    ca = store.load_certificate(ca_folder / "ca.crt")
    ca_key = store.load_private_key(ca_folder / "ca.key")
    held = manifests.load_manifest(federation / "manifest.toml")
    _, request = store.request_certificate(federation / "new", AUDITOR, "auditor")
    replacement = pin_certificate(
        store.load_certificate(store.sign_certificate(ca_folder, request, out=federation / "new" / "a.crt")), ca
    )
    rekeyed = manifest_update.signed_update(held, manifests.revoked(held, AUDITOR, replacement), ca_key)
    manifest_update.check_update(held, rekeyed, ca)
    removed = manifest_update.signed_update(held, manifests.revoked(held, AUDITOR), ca_key)
    with pytest.raises(ManifestError, match="changes .*auditors' names"):
        manifest_update.check_update(held, removed, ca)


def test_plan_show_under_two_verifiers_describes_the_bounded_sums_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not the masked round's re-sum: a bounded training sum is checked by tags alone, and a site that leaves
    before its tags voids its round (issue 94 found `plan show` describing the masked round under the mode)."""
    assert cli.main(["init", str(tmp_path / "fed"), "--sites", "a,b,c", "--auditor", "audit-co"]) == 0
    assert cli.main(["plan", "show", "--plan", str(tmp_path / "fed" / "aggregator" / "plan.toml")]) == 0
    out = capsys.readouterr().out
    assert "re-sum" not in out.replace("no site re-sums", "")
    assert "training sums: bounded sums, each checked by every accepted site's tags" in out, out
    assert "a site that leaves after sharing and before its tags voids that round" in out, out
    assert "unless its process, started again before DECIDE's deadline (which waits for it), answers" in out, out
    # Without training noise (init's plan) the leaver's limit, and a refused record's, as docs/security.md states them.
    assert "keeps the model as it is for the rest of the federation, which ends in bounded time (exit 3)" in out, out
    assert (
        "a site that refuses its verdict record (FORGED: one the aggregator tampered with) tags nothing and is " in out
    )
    assert "every site refuses the round naming the aggregator (FRAMED)" in out, out  # a framed site's dispute
    assert "input bound: two verifiers, the aggregator and auditor 'audit-co'" in out, out
