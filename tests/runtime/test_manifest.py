"""The federation manifest: loading it, and every check it adds against a CA that mints parties of its own.

The certificates are real (a fresh CA, requests signed the way `fedfair pki sign`
signs them); the attacker is whoever holds that CA: it mints a twin certificate for a
real institution and a certificate for a name nobody agreed on, and tries to run a
round with them, to shrink a round, or to pass off another plan.
"""

from __future__ import annotations

import json
import logging
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from cryptography.hazmat.primitives import serialization

from fedfair.core.errors import ConfigError, IdentityError
from fedfair.pki import credential_verifier, store
from fedfair.pki.roster import Roster, pins_from_folders, write_manifest
from fedfair.runtime import manifest as manifests
from fedfair.runtime import manifest_plan
from fedfair.runtime.plan import aggregator_plan as plan
from fedfair.runtime.collaborator import config as collaborator_file
from fedfair import cli
from fedfair.runtime.plan.pinning import pin_plan
from tests.runtime.test_plan import CONFIG_TEMPLATE, NO_NOISE, PLAN_TEMPLATE, SCHEMA_SECTION, edited

COLLABORATORS = ("hospital-a", "hospital-b", "hospital-c")  # the templates' names


def der(path: Path) -> bytes:
    return store.load_certificate(path).public_bytes(serialization.Encoding.DER)


@pytest.fixture()
def federation(tmp_path: Path) -> Path:
    """A CA folder with the aggregator's and the three institutions' certificates, and manifest.toml beside it."""
    ca = tmp_path / "ca"
    store.init_ca(ca)
    store.issue(ca, "aggregator", "aggregator")
    for name in COLLABORATORS:
        _, request = store.request_certificate(tmp_path / name, name, "collaborator")
        store.sign_certificate(ca, request)
    write_manifest(tmp_path / "manifest.toml", Roster("fedfair-demo", tuple(pins_from_folders([ca])), 0, 2))
    return tmp_path


def mint(federation: Path, name: str) -> bytes:
    """What the CA holder can do alone: a fresh key and a valid certificate for any name (DER)."""
    _, request = store.request_certificate(federation / "minted", name, "collaborator")
    return der(store.sign_certificate(federation / "ca", request, out=federation / "minted" / f"{name}.crt"))


def manifest_document(federation: Path) -> dict[str, Any]:
    with (federation / "manifest.toml").open("rb") as handle:
        return tomllib.load(handle)


def test_a_manifest_loads_and_its_digest_is_the_one_printed(federation: Path) -> None:
    loaded = manifests.load_manifest(federation / "manifest.toml")
    assert loaded.federation_id == "fedfair-demo" and loaded.max_colluding == 0 and loaded.min_round_size == 2
    assert loaded.aggregator.name == "aggregator" and loaded.collaborator_names == frozenset(COLLABORATORS)
    assert loaded.pin("hospital-b") is not None and loaded.pin("mallory") is None
    text = (federation / "manifest.toml").read_text()
    assert f"# sha256 of its content: {manifests.manifest_digest(loaded)}" in text
    # Layout, comments, the order of participants and the case of fingerprints are not content.
    document = manifest_document(federation)
    document["participants"].reverse()
    for entry in document["participants"]:
        entry["sha256"] = entry["sha256"].upper().replace(":", "")
    again = manifests.parse_manifest(document, federation / "reordered.toml")
    assert manifests.manifest_digest(again) == manifests.manifest_digest(loaded)
    assert again.collaborators == loaded.collaborators


def change(document: dict[str, Any], edit: str) -> dict[str, Any]:
    """The manifest with one mistake made in it."""
    participants = document["participants"]
    if edit == "no min_round_size":
        del document["federation"]["min_round_size"]
    elif edit == "unknown key":
        document["federation"]["max_coluding"] = 1
    elif edit == "unknown section":
        document["roster"] = {}
    elif edit == "no participants":
        del document["participants"]
    elif edit == "bad fingerprint":
        participants[1]["sha256"] = "ab:cd"
    elif edit == "bad role":
        participants[1]["role"] = "observer"
    elif edit == "bad name":
        participants[1]["name"] = "Hospital B"
    elif edit == "missing sha256":
        del participants[1]["sha256"]
    elif edit == "name twice":
        participants.append({**participants[1], "sha256": "00" * 32})
    elif edit == "no aggregator":
        document["participants"] = [entry for entry in participants if entry["role"] != "aggregator"]
    elif edit == "round too small":
        document["federation"].update(max_colluding=1, min_round_size=2)
    elif edit == "round too large":
        document["federation"]["min_round_size"] = 4
    elif edit == "bad federation id":
        document["federation"]["id"] = "bad id!"
    return document


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("no min_round_size", r"\[federation\] missing key 'min_round_size'; add min_round_size ="),
        ("unknown key", r"\[federation\] unknown key 'max_coluding'; did you mean 'max_colluding'\?"),
        ("unknown section", r"unknown section \[roster\]"),
        ("no participants", r"no \[\[participants\]\] tables; add one per participant with name, role and sha256"),
        ("bad fingerprint", r"\[\[participants\]\] #2 sha256 of '.*': 'ab:cd' is not a SHA-256 fingerprint"),
        ("bad role", r'\[\[participants\]\] #2 role = "observer" is not known'),
        ("bad name", r"\[\[participants\]\] #2 name: invalid participant name 'Hospital B'"),
        ("missing sha256", r"\[\[participants\]\] #2 missing key 'sha256'"),
        ("name twice", r"lists the name .* twice; list each participant once"),
        ("no aggregator", r'exactly one participant with role = "aggregator", found 0'),
        ("round too small", r"min_round_size = 2 is below max_colluding \+ 2 = 3"),
        ("round too large", r"min_round_size = 4 exceeds the 3 collaborators listed"),
        ("bad federation id", r"\[federation\] id must be letters"),
    ],
)
def test_manifest_errors_name_the_file_the_field_and_the_fix(federation: Path, edit: str, message: str) -> None:
    source = federation / "manifest.toml"
    with pytest.raises(ConfigError, match=message) as caught:
        manifests.parse_manifest(change(manifest_document(federation), edit), source)
    assert str(caught.value).startswith(f"{source}: ") and "\n" not in str(caught.value)


def test_a_missing_or_broken_manifest_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found; put there the copy the institutions agreed on"):
        manifests.load_manifest(tmp_path / "manifest.toml")
    (tmp_path / "manifest.toml").write_text("[federation\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        manifests.load_manifest(tmp_path / "manifest.toml")


def test_the_pinned_verifier_refuses_a_twin_and_a_stranger_the_same_ca_minted(federation: Path) -> None:
    agreed = manifests.load_manifest(federation / "manifest.toml")
    ca_certificate = store.load_certificate(federation / "ca" / "ca.crt")
    verify = manifests.pinned_verifier(agreed, ca_certificate)
    genuine = der(federation / "ca" / "hospital-a.crt")
    key = verify("hospital-a", genuine)
    assert key == store.load_private_key(federation / "hospital-a" / "hospital-a.key").public_key()
    twin, stranger = mint(federation, "hospital-a"), mint(federation, "mallory")
    # The CA vouches for both: a verifier that trusts the CA alone takes them.
    credential_verifier(ca_certificate)("hospital-a", twin)
    credential_verifier(ca_certificate)("mallory", stranger)
    with pytest.raises(IdentityError, match="not the one the manifest pins for it"):
        verify("hospital-a", twin)
    with pytest.raises(IdentityError, match="'mallory' is not in the federation's manifest"):
        verify("mallory", stranger)
    # The aggregator's certificate is pinned, but never as a collaborator's credential.
    with pytest.raises(IdentityError, match="not in the federation's manifest"):
        verify("aggregator", der(federation / "ca" / "aggregator.crt"))


def test_certificates_are_checked_against_their_pins(federation: Path) -> None:
    agreed = manifests.load_manifest(federation / "manifest.toml")
    manifests.check_aggregator_certificate(agreed, der(federation / "ca" / "aggregator.crt"))
    manifests.check_certificate(agreed, "hospital-b", der(federation / "ca" / "hospital-b.crt"))
    _, request = store.request_certificate(federation / "impostor", "aggregator", "aggregator")
    impostor = store.sign_certificate(federation / "ca", request, out=federation / "impostor" / "aggregator.crt")
    with pytest.raises(manifests.ManifestError, match="certificate of 'aggregator' .* is not the one the manifest"):
        manifests.check_aggregator_certificate(agreed, der(impostor))
    with pytest.raises(manifests.ManifestError, match="'mallory' is not a participant in the manifest"):
        manifests.check_certificate(agreed, "mallory", mint(federation, "mallory"))


def test_a_rounds_roster_holds_only_agreed_names_and_enough_of_them(federation: Path) -> None:
    agreed = manifests.load_manifest(federation / "manifest.toml")
    agreed.check_roster(COLLABORATORS)
    agreed.check_roster(("hospital-c", "hospital-a"))  # any subset of at least min_round_size
    with pytest.raises(manifests.ManifestError, match="includes 'mallory', not a collaborator in the manifest"):
        agreed.check_roster(("hospital-a", "mallory"))
    with pytest.raises(manifests.ManifestError, match="includes 'aggregator'"):
        agreed.check_roster(("hospital-a", "aggregator"))
    with pytest.raises(manifests.ManifestError, match="1 parties, fewer than min_round_size = 2"):
        agreed.check_roster(("hospital-a",))
    with pytest.raises(manifests.ManifestError, match="lists a party twice"):
        agreed.check_roster(("hospital-a", "hospital-a"))


def shared_from(**sections: dict[str, Any]) -> tuple[plan.SharedSettings, dict[str, Any]]:
    """The settings an aggregator with the template plan (edited) would share: parsed, and as they arrive."""
    aggregator_plan = plan.parse_aggregator_plan(edited(PLAN_TEMPLATE, sections), PLAN_TEMPLATE)
    payload = plan.shared_settings(aggregator_plan)
    return plan.load_shared_settings(payload), json.loads(payload)


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"federation": {"id": "other"}}, r"federation 'other', but the manifest .* is for 'fedfair-demo'"),
        (
            {"federation": {"collaborators": [*COLLABORATORS, "mallory"]}},
            r"4 collaborators, but the manifest .* lists 3; the aggregator's roster is not the one agreed on",
        ),
        ({"secure_aggregation": {"max_colluding": 1}}, r"max_colluding = 1 but the manifest .* says 0"),
        (
            {"secure_aggregation": {"enabled": False}, "quorum": {"min_collaborators": 1}, "privacy": NO_NOISE},
            r"min_collaborators = 1 is below min_round_size = 2",
        ),
        (
            {"secure_aggregation": {"enabled": False}, "quorum": {"min_collaborators": 2}, "privacy": NO_NOISE},
            r"secure aggregation is off, so the aggregator would see",
        ),
    ],
)
def test_a_collaborator_refuses_shared_settings_unlike_its_manifest(
    federation: Path, sections: dict[str, Any], message: str
) -> None:
    agreed = manifests.load_manifest(federation / "manifest.toml")
    manifest_plan.check_shared_settings(agreed, *shared_from())
    with pytest.raises(manifests.ManifestError, match=message):
        manifest_plan.check_shared_settings(agreed, *shared_from(**sections))


def aggregator_plan_with(folder: Path, /, **sections: dict[str, Any]) -> plan.AggregatorPlan:
    """The template plan (edited) naming the manifest in `folder` (or the one `aggregator` names)."""
    aggregator = {"manifest": str(folder / "manifest.toml"), **sections.pop("aggregator", {})}
    return plan.parse_aggregator_plan(edited(PLAN_TEMPLATE, {"aggregator": aggregator, **sections}), PLAN_TEMPLATE)


def test_an_aggregator_plan_naming_a_manifest_must_agree_with_it(federation: Path) -> None:
    loaded = aggregator_plan_with(federation)
    assert loaded.manifest == manifests.load_manifest(federation / "manifest.toml")
    assert loaded.aggregator.manifest == federation / "manifest.toml"
    # A plan under a manifest is another plan: its checkpoints do not resume without it.
    assert plan.plan_digest(loaded) != plan.plan_digest(plan.load_aggregator_plan(PLAN_TEMPLATE))
    assert plan.shared_settings(loaded) == plan.shared_settings(plan.load_aggregator_plan(PLAN_TEMPLATE))


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"federation": {"collaborators": [*COLLABORATORS, "mallory"]}}, r"collaborators lists 'mallory' unlike"),
        ({"federation": {"collaborators": list(COLLABORATORS[:2])}}, r"collaborators leaves out 'hospital-c' unlike"),
        ({"aggregator": {"name": "hub"}}, r"\[aggregator\] name = 'hub' but the manifest .* names 'aggregator'"),
        ({"federation": {"id": "other"}}, r"federation 'other', but the manifest"),
        ({"secure_aggregation": {"max_colluding": 1}}, r"max_colluding = 1 but the manifest .* says 0"),
    ],
)
def test_aggregator_plan_errors_against_the_manifest(federation: Path, sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        aggregator_plan_with(federation, **sections)
    assert str(caught.value).startswith(f"{PLAN_TEMPLATE}: ")


def test_a_quorum_below_the_manifests_round_size_is_refused(federation: Path) -> None:
    strict = federation / "strict.toml"
    strict.write_text(Roster("fedfair-demo", tuple(pins_from_folders([federation / "ca"])), 0, 3).text())
    with pytest.raises(ConfigError, match=r"min_collaborators = 2 is below min_round_size = 3"):
        aggregator_plan_with(federation, aggregator={"manifest": str(strict)})
    assert aggregator_plan_with(federation, aggregator={"manifest": str(strict)}, quorum={"min_collaborators": 3})


def collaborator_with(folder: Path, /, **values: Any) -> collaborator_file.CollaboratorConfig:
    """The template collaborator config (its [collaborator] edited) naming the manifest in `folder`."""
    settings = {"manifest": str(folder / "manifest.toml"), **values}
    document = edited(CONFIG_TEMPLATE, {"collaborator": settings})
    return collaborator_file.parse_collaborator_config(document, CONFIG_TEMPLATE)


def test_a_collaborator_config_takes_its_federation_and_aggregator_from_the_manifest(federation: Path) -> None:
    loaded = collaborator_with(federation, federation=..., aggregator_name=...)
    assert loaded.manifest == manifests.load_manifest(federation / "manifest.toml")
    assert loaded.federation == "fedfair-demo" and loaded.aggregator_name == "aggregator"
    with pytest.raises(ConfigError, match=r"name = 'bank' is not a collaborator in the manifest"):
        collaborator_with(federation, name="bank")
    with pytest.raises(ConfigError, match=r"federation = 'other' but the manifest .* says 'fedfair-demo'"):
        collaborator_with(federation, federation="other")
    with pytest.raises(ConfigError, match=r"aggregator_name = 'hub' but the manifest .* says 'aggregator'"):
        collaborator_with(federation, aggregator_name="hub")
    with pytest.raises(ConfigError, match=r"\[collaborator\] manifest: manifest .* not found") as caught:
        collaborator_with(federation, manifest="nowhere.toml")
    assert str(caught.value).startswith(f"{CONFIG_TEMPLATE}: ")


def toml_text(document: dict[str, Any]) -> str:
    """A collaborator config as TOML (tables of strings, numbers and lists: JSON quoting is TOML quoting)."""
    lines = []
    for section, table in document.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


def test_without_a_manifest_the_collaborator_warns_once_that_the_ca_holds_the_roster(
    federation: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="fedfair.collaborator"):
        loaded = collaborator_file.load_collaborator_config(CONFIG_TEMPLATE)
    assert loaded.manifest is None and loaded.federation == "fedfair-demo"
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "trusted to the federation's CA" in warnings[0] and "\n" not in warnings[0]
    caplog.clear()
    with_manifest = federation / "collaborator.toml"
    document = edited(CONFIG_TEMPLATE, {"collaborator": {"manifest": str(federation / "manifest.toml")}})
    with_manifest.write_text(toml_text(document))
    with caplog.at_level(logging.WARNING, logger="fedfair.collaborator"):
        assert collaborator_file.load_collaborator_config(with_manifest).manifest is not None
    # A roster without a pinned plan still leaves the plan to the aggregator: one line says so.
    assert [record.getMessage() for record in caplog.records] == [
        f"{federation / 'manifest.toml'}: {manifests.UNPINNED_PLAN_WARNING}"
    ]
    caplog.clear()
    pinned = federation / "pinned.toml"
    pin_plan(PLAN_TEMPLATE, federation / "manifest.toml", pinned)
    document = edited(CONFIG_TEMPLATE, {"collaborator": {"manifest": str(pinned)}})
    with_manifest.write_text(toml_text(document))
    with caplog.at_level(logging.WARNING, logger="fedfair.collaborator"):
        assert collaborator_file.load_collaborator_config(with_manifest).manifest is not None
    assert not caplog.records


# ---------------------------------------------------------------- the pinned plan


@pytest.fixture()
def pinned(federation: Path) -> manifests.Manifest:
    """The manifest with the template plan pinned (as `fedfair plan pin` writes it)."""
    pin_plan(PLAN_TEMPLATE, federation / "manifest.toml", federation / "pinned.toml")
    return manifests.load_manifest(federation / "pinned.toml")


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        # What the security review changed through an unpinned plan, and the other knobs the issue names.
        ({"model": {"name": ..., "factory": "os:system", "arguments": {"command": "touch marker"}}}, "model.factory"),
        ({"evaluation": {"loss_range": [20.0, 80.0]}}, "evaluation.loss_range"),
        ({"evaluation": {"every": 1}}, "evaluation.every"),
        ({"secure_aggregation": {"neighbours": 2}}, "secure_aggregation.neighbours"),
        ({"secure_aggregation": {"threshold": 2}}, "secure_aggregation.threshold"),
        ({"secure_aggregation": {"clip": 100.0}}, "secure_aggregation.clip"),
        ({"secure_aggregation": {"max_weight": 1e7}}, "secure_aggregation.max_weight"),
        # 32-bit words hold the sum only with a smaller weight and fewer fractional bits (the plan checks it).
        (
            {"secure_aggregation": {"modulus_bits": 32, "max_weight": 100.0, "fractional_bits": 8}},
            "secure_aggregation.modulus_bits",
        ),
        ({"training": {"batch_fraction": 1.0}}, "training.batch_fraction"),
        ({"training": {"rounds": 7}}, "training.rounds"),
        ({"training": {"local_steps": 3}}, "training.local_steps"),
        ({"training": {"lr": 0.5}}, "training.lr"),
        ({"objective": {"rho": 0.5}}, "objective.rho"),
        ({"model": {"name": "mlp"}}, "model.name"),
    ],
)
def test_a_collaborator_refuses_any_plan_but_the_pinned_one_and_names_the_field(
    pinned: manifests.Manifest, sections: dict[str, Any], field: str
) -> None:
    manifest_plan.check_shared_settings(pinned, *shared_from())
    with pytest.raises(manifests.ManifestError, match=r"is not the plan pinned by the manifest") as caught:
        manifest_plan.check_shared_settings(pinned, *shared_from(**sections))
    assert f"{field}: " in str(caught.value) and "fedfair plan pin" in str(caught.value)


def test_the_pin_covers_the_schema_so_a_numeric_column_cannot_become_categorical(federation: Path) -> None:
    schema = {
        "label": "income",
        "classes": ["<=50K", ">50K"],
        "columns": [
            {"name": "age", "type": "numeric", "range": [0, 120]},
            {"name": "workclass", "type": "categorical", "categories": "learn"},
        ],
    }
    with_schema = {"schema": schema, "model": {"features": ...}}
    agreed_plan = federation / "schema-plan.toml"
    document = edited(PLAN_TEMPLATE, with_schema)
    agreed_plan.write_text(tomli_w.dumps(document))
    pin_plan(agreed_plan, federation / "manifest.toml", federation / "pinned.toml")
    pinned = manifests.load_manifest(federation / "pinned.toml")
    manifest_plan.check_shared_settings(pinned, *shared_from(**with_schema))
    relabelled = {
        **schema,
        "columns": [{"name": "age", "type": "categorical", "categories": "learn"}, schema["columns"][1]],
    }
    with pytest.raises(manifests.ManifestError, match=r"schema\.columns\[age\]\.type: \"numeric\" -> \"categorical\""):
        manifest_plan.check_shared_settings(pinned, *shared_from(schema=relabelled, model={"features": ...}))


def test_the_pin_covers_the_composition_columns_so_no_other_column_can_be_counted(federation: Path) -> None:
    """A collaborator counts the worst group by the columns of the plan its manifest pins: an aggregator
    serving the same plan with another column, or with the stage on where the pin has it off, is refused."""
    with_schema = {"schema": SCHEMA_SECTION, "model": {"features": ...}}
    agreed_plan = federation / "composition-plan.toml"
    agreed_plan.write_text(
        tomli_w.dumps(edited(PLAN_TEMPLATE, {**with_schema, "evaluation": {"composition": ["race"]}}))
    )
    pin_plan(agreed_plan, federation / "manifest.toml", federation / "pinned.toml")
    pinned = manifests.load_manifest(federation / "pinned.toml")
    manifest_plan.check_shared_settings(pinned, *shared_from(**with_schema, evaluation={"composition": ["race"]}))
    with pytest.raises(manifests.ManifestError, match=r'evaluation\.composition: added \["income"\]'):
        manifest_plan.check_shared_settings(
            pinned, *shared_from(**with_schema, evaluation={"composition": ["race", "income"]})
        )
    with pytest.raises(manifests.ManifestError, match=r"evaluation\.composition"):
        manifest_plan.check_shared_settings(pinned, *shared_from(**with_schema))


def test_a_pin_whose_settings_were_edited_by_hand_is_refused(federation: Path, pinned: manifests.Manifest) -> None:
    text = (federation / "pinned.toml").read_text()
    assert '"rounds": 50' in text
    (federation / "forged.toml").write_text(text.replace('"rounds": 50', '"rounds": 7'))
    with pytest.raises(ConfigError, match=r"\[plan\] sha256 = .* is not the digest of its settings"):
        manifests.load_manifest(federation / "forged.toml")


def test_the_manifests_digest_covers_the_pinned_plan(federation: Path, pinned: manifests.Manifest) -> None:
    roster = manifests.load_manifest(federation / "manifest.toml")
    assert manifests.manifest_digest(pinned) != manifests.manifest_digest(roster)
    text = (federation / "pinned.toml").read_text()
    assert f"# sha256 of its content: {manifests.manifest_digest(pinned)}" in text


def test_an_aggregator_whose_plan_is_not_the_pinned_one_does_not_start(
    federation: Path, pinned: manifests.Manifest
) -> None:
    assert aggregator_plan_with(federation, aggregator={"manifest": str(federation / "pinned.toml")})
    with pytest.raises(ConfigError, match=r"training\.lr: 0\.1 -> 0\.5") as caught:
        aggregator_plan_with(federation, aggregator={"manifest": str(federation / "pinned.toml")}, training={"lr": 0.5})
    assert str(caught.value).startswith(f"{PLAN_TEMPLATE}: ") or str(PLAN_TEMPLATE) in str(caught.value)


def test_changing_the_plan_is_a_new_pin_and_plan_diff_shows_it(
    federation: Path, pinned: manifests.Manifest, capsys: pytest.CaptureFixture[str]
) -> None:
    edited_plan = federation / "plan.toml"
    edited_plan.write_text(tomli_w.dumps(edited(PLAN_TEMPLATE, {"training": {"rounds": 200}})))
    pin = ["plan", "pin", "--plan", str(edited_plan), "--manifest", str(federation / "pinned.toml")]
    assert cli.main([*pin, "--out", str(federation / "pinned-2.toml")]) == 0
    printed = capsys.readouterr().out
    assert "training.rounds: 50 -> 200" in printed
    renewed = manifests.load_manifest(federation / "pinned-2.toml")
    assert f"manifest sha256 {manifests.manifest_digest(renewed)}" in printed
    assert renewed.plan is not None and renewed.plan.settings["training"]["rounds"] == 200
    assert "next: every institution reviews `fedfair plan diff OLD NEW`" in printed
    assert cli.main(["plan", "diff", str(federation / "pinned.toml"), str(federation / "pinned-2.toml")]) == 1
    assert capsys.readouterr().out == "training.rounds: 50 -> 200\n"
    assert cli.main(["plan", "diff", str(federation / "pinned-2.toml"), str(edited_plan)]) == 0
    assert capsys.readouterr().out == "the same plan\n"
    # A manifest in force is never overwritten: the new one is a new file every institution accepts.
    assert cli.main([*pin, "--out", str(federation / "pinned-2.toml")]) == 2


def test_renew_shows_the_plan_edits_it_carries_into_the_new_manifest(
    federation: Path, pinned: manifests.Manifest, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_file = federation / "plan.toml"
    plan_file.write_text(PLAN_TEMPLATE.read_text().replace("rounds = 50 ", "rounds = 1500 ", 1))
    renew = ["plan", "renew", "--plan", str(plan_file), "--manifest", str(federation / "pinned.toml")]
    assert cli.main([*renew, "--federation", "fed-2", "--out", str(federation / "fed-2.toml")]) == 0
    printed = capsys.readouterr().out
    assert "the plan also changed since" in printed and "training.rounds: 50 -> 1500" in printed
    assert f"fedfair plan diff {federation / 'pinned.toml'} {federation / 'fed-2.toml'}" in printed


def test_a_first_pin_says_what_comes_next_without_an_old_plan_to_diff(
    federation: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_file = federation / "plan.toml"
    plan_file.write_text(tomli_w.dumps(edited(PLAN_TEMPLATE, {})))
    pin = ["plan", "pin", "--plan", str(plan_file), "--manifest", str(federation / "manifest.toml")]
    assert cli.main([*pin, "--out", str(federation / "first.toml")]) == 0
    printed = capsys.readouterr().out
    assert "the plan is pinned for the first time" in printed
    assert "plan diff" not in printed
    assert f"next: send {federation / 'first.toml'} to every institution" in printed


def test_a_plan_naming_the_manifest_its_pin_will_write_can_be_pinned(federation: Path) -> None:
    # The order the README of `fedfair init` gives: name the manifest in the plan, then pin the plan to it.
    written = federation / "plan.toml"
    written.write_text(tomli_w.dumps(edited(PLAN_TEMPLATE, {"aggregator": {"manifest": "pinned.toml"}})))
    assert not (federation / "pinned.toml").exists()
    pin_plan(written, federation / "manifest.toml", federation / "pinned.toml")
    assert plan.load_aggregator_plan(written).manifest == manifests.load_manifest(federation / "pinned.toml")


def test_setting_differences_spell_out_a_schemas_columns() -> None:
    """Institutions reviewing a re-pin see which categories were added, not two texts cut at 80 characters."""
    column = {"name": "workclass", "type": "categorical", "categories": ["Private", "State-gov"]}
    hours = {"name": "hours", "type": "numeric"}
    pinned = {"schema": {"columns": [column, hours], "missing": "refuse"}}
    edited = {**column, "categories": ["Private", "State-gov", "Never-worked", "Without-pay"]}
    served = {"schema": {"columns": [edited, {**hours, "type": "categorical"}, {"name": "age", "type": "numeric"}],
                         "missing": "impute"}}  # fmt: skip
    assert manifest_plan.setting_differences(pinned, served) == [
        'schema.columns[age]: added {"name": "age", "type": "numeric"}',
        'schema.columns[hours].type: "numeric" -> "categorical"',
        'schema.columns[workclass].categories: added ["Never-worked", "Without-pay"]',
        'schema.missing: "refuse" -> "impute"',
    ]
    reordered = {"schema": {"columns": [hours, column], "missing": "refuse"}}
    assert manifest_plan.setting_differences(pinned, reordered) == [
        'schema.columns: order ["workclass", "hours"] -> ["hours", "workclass"]'
    ]


def test_setting_differences_name_leaves_even_under_an_empty_table() -> None:
    pinned = {"model": {"arguments": {}, "name": "x"}, "training": {"lr": 0.1}}
    served = {"model": {"arguments": {"hidden": 8}, "name": "x"}, "training": {"lr": 0.1, "rounds": 3}}
    assert manifest_plan.setting_differences(pinned, served) == [
        "model.arguments.hidden: (absent) -> 8",
        "training.rounds: (absent) -> 3",
    ]
    assert manifest_plan.setting_differences(served, served) == []


@pytest.mark.parametrize(
    "settings",
    ["[" * 100_000 + "]" * 100_000, '{"rounds": ' + "9" * 5000 + "}", '{"rounds": 5', "[1, 2]"],
    ids=["100,000 deep", "5,000 digits", "cut short", "not an object"],
)
def test_a_pinned_settings_text_that_is_no_json_object_is_a_named_error(
    federation: Path, pinned: manifests.Manifest, settings: str
) -> None:
    document = tomllib.loads((federation / "pinned.toml").read_text())
    document["plan"]["settings"] = settings
    (federation / "broken.toml").write_text(tomli_w.dumps(document))
    with pytest.raises(ConfigError, match=r"broken.toml.*\[plan\] settings.*; write the manifest again with `fedfair"):
        manifests.load_manifest(federation / "broken.toml")
