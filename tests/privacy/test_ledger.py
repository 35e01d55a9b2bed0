"""One ledger per institution and dataset: charged across federations, reset only on purpose, and refused
when edited (a hash chain over its entries, every value range-checked)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedfair.core.errors import BudgetReason, ConfigError, PrivacyBudgetError
from fedfair.privacy import distributed
from fedfair.privacy.ledger import Charge, Ledger, entry_hash, ledger_path

DATA = {"csv": "/data/hospital-a.csv"}
RELEASE = distributed.Release("skellam", 2e6, 40.0, 10.0, 0.05)
DELTA = 1e-5


def opened(tmp_path: Path) -> Ledger:
    return Ledger(ledger_path(tmp_path, "hospital-a", DATA), "hospital-a", DATA)


def charged(tmp_path: Path, federations: tuple[str, ...] = ("first", "first", "second")) -> Ledger:
    ledger = opened(tmp_path)
    for round_number, federation in enumerate(federations, start=1):
        ledger.charge(federation, Charge("train", round_number, f"m{round_number}", RELEASE, DELTA), 1e9)
    return ledger


def exact(steps: int) -> float:
    """The epsilon of `steps` identical releases, composed directly by the accountant."""
    return distributed.epsilon([dataclasses.replace(RELEASE, steps=steps)], DELTA)


def test_the_path_is_keyed_by_the_site_and_its_data_not_the_federation(tmp_path: Path) -> None:
    path = ledger_path(tmp_path, "hospital-a", DATA)
    assert path == ledger_path(tmp_path, "hospital-a", dict(reversed(list(DATA.items()))))
    assert path != ledger_path(tmp_path, "hospital-a", {"csv": "/data/other.csv"})
    assert path != ledger_path(tmp_path, "hospital-b", DATA)
    assert path.name.startswith("hospital-a.") and path.name.endswith(".ledger.json")


def test_every_federation_spends_one_budget_and_a_restart_continues_it(tmp_path: Path) -> None:
    """Three releases in two federations compose as three steps of one mechanism: the second federation did
    not start at epsilon 0, and the budget refuses what would pass it, whichever federation asks."""
    ledger = charged(tmp_path)
    assert ledger.spent(DELTA) == pytest.approx(exact(3), rel=1e-12)
    assert ledger.spent(DELTA, "first") == pytest.approx(exact(2), rel=1e-12)
    assert ledger.spent(DELTA, "second") == pytest.approx(exact(1), rel=1e-12)
    restarted = opened(tmp_path)
    assert restarted.spent(DELTA) == pytest.approx(exact(3), rel=1e-12) and restarted.count("first") == 2
    budget = (exact(3) + exact(4)) / 2  # room for three, not four
    with pytest.raises(PrivacyBudgetError, match=r"2 train answers in first, 1 train answers in second") as refused:
        restarted.charge("third", Charge("evaluate", 1, "m", RELEASE, DELTA), budget)
    assert refused.value.reason is BudgetReason.ANSWER_REFUSED
    assert len(opened(tmp_path).entries()) == 3  # a refused answer charges nothing


def test_a_reset_is_an_entry_and_ends_the_spend_so_far(tmp_path: Path) -> None:
    ledger = charged(tmp_path)
    assert ledger.reset("a new cohort: different people") == pytest.approx(exact(3), rel=1e-12)
    again = opened(tmp_path)
    assert again.spent(DELTA) == 0.0 and again.resets == 1 and again.count("first") == 2
    assert again.entries()[-1]["reason"] == "a new cohort: different people"
    again.charge("second", Charge("train", 4, "m4", RELEASE, DELTA), 1e9)
    assert opened(tmp_path).spent(DELTA) == pytest.approx(exact(1), rel=1e-12)
    with pytest.raises(ConfigError, match="needs a reason"):
        again.reset("  ")


def edit_entry(index: int, **values: object) -> Callable[[dict[str, Any]], object]:
    return lambda document: document["entries"][index].update(values)


def drop_key(index: int, key: str) -> Callable[[dict[str, Any]], object]:
    return lambda document: document["entries"][index].pop(key)


def rechained(document: dict[str, Any]) -> None:
    """mu raised to 1e300 on entry 1, and the hashes after it recomputed: only the range check is left."""
    entries = document["entries"]
    entries[1]["mu"] = 1e300
    for index in range(2, len(entries)):
        entries[index]["prev"] = entry_hash(entries[index - 1])
    document["head"] = entry_hash(entries[-1])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (edit_entry(1, mu=2e9), r"entry 2: its prev is not the hash of the entry before it"),
        (edit_entry(2, mu=2e7), r"head records 3 entries ending in .* but the file holds 3 ending in"),
        (lambda document: document["entries"].pop(0), r"entry 0: its prev is not the hash"),
        (lambda document: document["entries"].pop(), r"head records 3 entries .* file holds 2"),
        (lambda document: document.update(entries=[]), r"head records 3 entries .* file holds 0"),
        (lambda document: document.pop("head"), r"missing head"),
        (lambda document: document.update(version=0), r"version 0, this fedfair reads 2"),
        (lambda document: document.update(data={"csv": "/elsewhere.csv"}), r"is the ledger of 'hospital-a' for"),
        (drop_key(0, "delta"), r"entry 0: .*missing delta"),
        (rechained, r"entry 1: mu = 1e\+300 is outside \(0, 1\.84467e\+19\]"),
    ],
)
def test_an_edited_or_truncated_ledger_is_refused_naming_the_file_and_entry(
    tmp_path: Path, edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    path = charged(tmp_path).path
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=message) as refused:
        opened(tmp_path)
    assert str(path) in str(refused.value) or "is the ledger of" in str(refused.value)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("kind", "bonus", "kind = 'bonus' is not one of"),
        ("federation", "../x", "federation = '../x' is not a federation id"),
        ("round", -1, "round = -1 is not a round number"),
        ("round", True, "round = True is not a round number"),
        ("mu", 0.0, r"mu = 0.0 is outside \(0"),
        ("l2", "10", "l2 = '10' is not a finite number"),
        ("sampling_rate", 1.5, r"sampling_rate = 1.5 is outside \(0, 1\]"),
        ("delta", 1.0, "delta = 1 is not below 1"),
        ("addon", 1e-4, "addon = 0.0001 is not below delta"),
        ("mechanism", "gaussian", "mechanism = 'gaussian' is not one of skellam"),
        ("rounding", 0, "rounding = 0 is not a count of coordinates"),
        ("rounding", 128.0, "rounding = 128.0 is not a count of coordinates"),
    ],
)
def test_every_value_is_range_checked_even_with_a_consistent_chain(
    tmp_path: Path, field: str, value: object, message: str
) -> None:
    """A careless script that rewrites the file with its hashes recomputed still cannot put an odd value in."""
    path = charged(tmp_path, ("first",)).path
    document = json.loads(path.read_text())
    document["entries"][0][field] = value
    document["head"] = entry_hash(document["entries"][0])
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=f"{path}: entry 0: {message}"):
        opened(tmp_path)


def test_a_release_charged_in_expectation_over_its_rounding_keeps_it_across_a_restart(tmp_path: Path) -> None:
    # Training's releases average over the rounding of their m coordinates; the entry records m, and only then,
    # so that the ledger composes exactly what was charged, and entries written before it read as they did.
    rounded = dataclasses.replace(RELEASE, rounding=128)
    ledger = opened(tmp_path)
    for round_number, release in enumerate((rounded, RELEASE, rounded), start=1):
        ledger.charge("first", Charge("train", round_number, "m", release, DELTA), 1e9)
    direct = distributed.epsilon([dataclasses.replace(rounded, steps=2), RELEASE], DELTA)
    assert direct > exact(3)  # its rounding costs d / 4 = 32 more squared units than the shift of 10
    assert opened(tmp_path).spent(DELTA) == pytest.approx(direct, rel=1e-12)
    assert [entry.get("rounding") for entry in opened(tmp_path).entries()] == [128, None, 128]


def test_folding_old_releases_checks_them_and_happens_once(tmp_path: Path) -> None:
    ledger = opened(tmp_path)
    old = {"kind": "evaluate", "round": 2, "model": "m", "mechanism": "skellam", "mu": 2e6, "l1": 40.0, "l2": 10.0,
           "delta": DELTA}  # fmt: skip
    assert ledger.fold("old", [old, {**old, "round": 3}]) == 2
    assert ledger.fold("old", [old]) == 0
    assert [entry["sampling_rate"] for entry in opened(tmp_path).releases("old")] == [1.0, 1.0]
    with pytest.raises(ConfigError, match=r"release 0 of federation other: mu = -1"):
        ledger.fold("other", [{**old, "mu": -1}])


_CHARGING = """
import sys
from pathlib import Path
from fedfair.privacy import distributed
from fedfair.privacy.ledger import Charge, Ledger

ledger = Ledger(Path(sys.argv[1]), "hospital-a", {"csv": "/data/hospital-a.csv"})
release = distributed.Release("skellam", 2e6, 40.0, 10.0, 0.05)
for round_number in range(1, 41):
    ledger.charge(sys.argv[2], Charge("train", round_number, f"m{round_number}", release, 1e-5), 1e9)
"""


def test_two_processes_of_one_site_charge_one_ledger_without_losing_a_charge(tmp_path: Path) -> None:
    """Two federations at once (two collaborator processes of one site) share the data's ledger: each charge
    is made under its lock on what is on disk, so both processes' 40 charges are all there, chained."""
    path = ledger_path(tmp_path, "hospital-a", DATA)
    children = [
        subprocess.Popen([sys.executable, "-c", _CHARGING, str(path), federation]) for federation in ("one", "two")
    ]
    assert [child.wait(120) for child in children] == [0, 0]
    ledger = opened(tmp_path)
    assert (ledger.count("one"), ledger.count("two")) == (40, 40)
    assert ledger.spent(DELTA) == pytest.approx(exact(80), rel=1e-12)


def test_a_moved_ledger_takes_its_new_home_and_a_copy_beside_its_original_is_refused(tmp_path: Path) -> None:
    """The lineage is in the chain's genesis, so a copy cannot pass as another ledger without recomputing it."""
    ledger = charged(tmp_path / "a")
    moved = tmp_path / "b" / ledger.path.name
    moved.parent.mkdir()
    ledger.path.rename(moved)
    again = Ledger(moved, "hospital-a", DATA)
    assert again.lineage == ledger.lineage and again.spent(DELTA) == pytest.approx(exact(3), rel=1e-12)
    assert json.loads(moved.read_text())["home"] == str(moved)  # written at once with its new home
    copy = tmp_path / "c" / moved.name
    copy.parent.mkdir()
    copy.write_bytes(moved.read_bytes())
    with pytest.raises(ConfigError, match=rf"{copy}.* is a copy of the ledger at {moved}"):
        Ledger(copy, "hospital-a", DATA)
    document = json.loads(copy.read_text())
    document["lineage"] = "0" * 32  # passed off as a ledger of its own
    copy.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=r"entry 0: its prev is not the hash of the entry before it"):
        Ledger(copy, "hospital-a", DATA)
