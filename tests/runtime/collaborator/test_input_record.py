"""The collaborator's record: one input per model, kept bits, and state that never silently resets."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedfair.core.errors import BudgetReason, ConfigError, PermanentFailureError, PrivacyBudgetError, RefusedError
from fedfair.privacy import distributed
from fedfair.privacy.ledger import Charge, Ledger
from fedfair.privacy.ledger_people import TABLE_KEY
from fedfair.runtime.collaborator.input_record import BoundData, InputRecord, fold_records
from fedfair.runtime.collaborator.stored_answer import StoredAnswer
from fedfair.runtime.failures import TABLE_CHANGED


def record_path(tmp_path: Path) -> Path:
    return tmp_path / "site-1.fed.bindings.json"


def answered(
    path: Path, round_number: int, kind: str = "train", model: str = "m", *, reset: bool = False
) -> StoredAnswer:
    """Answer (kind, round, model) with fresh bits, kept as a real round keeps them; return those bits."""
    encoded = np.frombuffer(np.random.default_rng(round_number).bytes(64), dtype=np.uint64).copy()
    kept = StoredAnswer(np.linspace(-1.0, 1.0, 8), 3.0, encoded)
    InputRecord(path, "fed", reset=reset).view(round_number, kind, model).keep(kept)
    return kept


def test_the_same_request_gets_the_same_bits_after_a_restart(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    first = answered(path, 2, reset=True)
    again = InputRecord(path, "fed").view(2, "train", "m").stored
    assert again is not None and again.weight == first.weight
    assert again.encoded is not None and first.encoded is not None
    assert again.vector is not None and first.vector is not None
    assert again.encoded.tobytes() == first.encoded.tobytes() and again.vector.tobytes() == first.vector.tobytes()
    assert not again.encoded.flags.writeable  # re-sent under fresh masks, from a copy


def test_a_round_answered_with_one_model_refuses_another(tmp_path: Path) -> None:
    # The 1-ulp push: the same round on a model one ulp away would replace the kept update.
    path = record_path(tmp_path)
    answered(path, 2, model="m", reset=True)
    with pytest.raises(RefusedError, match="round 2 .train. was already answered for another model"):
        InputRecord(path, "fed").view(2, "train", "m-plus-one-ulp")
    # Another kind of the same round is another input.
    assert InputRecord(path, "fed").view(2, "evaluate", "m-plus-one-ulp").stored is None


def test_a_model_carried_into_a_later_round_gets_the_same_bits(tmp_path: Path) -> None:
    # An aborted round leaves the model unchanged: the next round carries it again.
    path = record_path(tmp_path)
    first = answered(path, 2, reset=True)
    again = InputRecord(path, "fed").view(3, "train", "m").stored
    assert again is not None and again.encoded is not None and first.encoded is not None
    assert again.encoded.tobytes() == first.encoded.tobytes()
    restarted = InputRecord(path, "fed")
    assert restarted.latest == 3
    with pytest.raises(RefusedError, match="round 3 .train. was already answered for another model"):
        restarted.view(3, "train", "other")


def test_only_the_latest_answer_of_a_kind_is_kept_and_older_ones_are_not_answered_again(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    answered(path, 2, model="a", reset=True)
    answered(path, 3, model="b")
    record = InputRecord(path, "fed")
    assert record.view(3, "train", "b").stored is not None
    with pytest.raises(
        PermanentFailureError, match="federation-past: .* round 3 of federation fed .* now serves round 2"
    ):
        record.view(2, "train", "a")


def test_only_the_latest_answer_of_a_kind_is_read_back(tmp_path: Path) -> None:
    record = InputRecord(record_path(tmp_path), "fed")
    views = []
    for round_number in (1, 2, 3):
        views.append(record.view(round_number, "train", f"m{round_number}"))
        views[-1].keep(StoredAnswer(np.full(4, float(round_number)), 1.0))
    evaluated = record.view(3, "evaluate", "m3")
    evaluated.keep(StoredAnswer(np.zeros(2), 1.0))
    assert [view.stored is not None for view in views] == [False, False, True]
    assert evaluated.stored is not None  # another kind's answer is not the training's to let go
    with pytest.raises(PermanentFailureError, match="federation-past"):
        record.view(2, "train", "m2")


def test_a_kept_answer_is_read_back_from_its_file_not_held(tmp_path: Path) -> None:
    """The view reads the very bits kept, read-only, from the file: the caller's arrays, reused after keep (the
    encoding is masked in place), change nothing; a file changed since is refused, not sent."""
    record = InputRecord(record_path(tmp_path), "fed")
    view = record.view(1, "train", "m")
    vector, encoded = np.linspace(-1.0, 1.0, 8), np.arange(9, dtype=np.uint16)
    view.keep(StoredAnswer(vector, 2.0, encoded))
    sent_vector, sent_encoded = vector.copy(), encoded.copy()
    vector[:], encoded[:] = 5.0, 7
    for answer in (view.stored, record.view(1, "train", "m").stored):
        assert answer is not None and answer.weight == 2.0
        assert answer.vector is not None and answer.encoded is not None
        assert np.array_equal(answer.vector, sent_vector) and not np.shares_memory(answer.vector, vector)
        assert answer.encoded.tobytes() == sent_encoded.tobytes() and not answer.encoded.flags.writeable
    kept_file = tmp_path / "site-1.fed.train.kept.npz"
    payload = bytearray(kept_file.read_bytes())
    payload[-30] ^= 1
    kept_file.write_bytes(bytes(payload))
    with pytest.raises(RefusedError, match="kept bits changed or were lost"):
        view.stored  # noqa: B018  # the read is what is tested


def test_a_changed_kept_file_is_not_sent_and_the_input_is_refused(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    answered(path, 2, reset=True)
    kept_file = tmp_path / "site-1.fed.train.kept.npz"
    payload = bytearray(kept_file.read_bytes())
    payload[-30] ^= 1
    kept_file.write_bytes(bytes(payload))
    with pytest.raises(RefusedError, match="answered in round 2, and its bits are no longer kept"):
        InputRecord(path, "fed").view(2, "train", "m")


def test_a_lost_record_is_refused_past_the_first_round_unless_reset(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    with pytest.raises(
        PermanentFailureError, match=r"local-state-lost: .* the aggregator is at round 5.*--reset-state"
    ):
        InputRecord(path, "fed").view(5, "train", "m")
    assert InputRecord(path, "fed").view(1, "train", "m").stored is None  # a federation's first round
    assert InputRecord(path, "fed", reset=True).view(5, "train", "m").stored is None


def test_the_accountant_must_go_with_the_record(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    answered(path, 1, model="m1")
    answered(path, 2, model="m2")
    record = InputRecord(path, "fed")
    assert record.trainings == 2
    record.check_accountant(2, tmp_path / "privacy.json")  # charged before training: never fewer
    with pytest.raises(ConfigError, match="has charged 1 rounds, but .* records 2 trained: .* lost or rolled back"):
        record.check_accountant(1, tmp_path / "privacy.json")
    # An accountant that charged rounds beside no record at all: the record was lost.
    with pytest.raises(PermanentFailureError, match="local-state-lost: .* its privacy accountant charged 3 rounds"):
        InputRecord(tmp_path / "other.fed.bindings.json", "fed").check_accountant(3, None)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ('{"format": "fedfair-bindings", "latest": 1e999, "inputs": {}}', r"field latest = 1e999 is out of range"),
        ('{"format": "fedfair-bindings", "latest": -2, "inputs": {}}', r"latest = -2 is not a round count"),
        ("[" * 100_000 + "]" * 100_000, r"nested 100000 levels deep"),
        ('{"format": "something else"}', r"not a bindings file"),
    ],
)
def test_odd_values_in_the_record_are_named_errors(tmp_path: Path, document: str, message: str) -> None:
    path = record_path(tmp_path)
    path.write_text(document)
    with pytest.raises(ConfigError, match=message):
        InputRecord(path, "fed")


def test_a_noised_input_signed_in_one_round_binds_no_later_round(tmp_path: Path) -> None:
    # One party left after round 2's sum over a, b, c was unmasked: under distributed noise each input is one
    # round's release, so round 3 on the unchanged model is a fresh input, free to be signed for a and b.
    path = record_path(tmp_path)
    first = InputRecord(path, "fed", reset=True).view(2, "train", "m", one_round=True)
    first.keep(StoredAnswer(None, 1.0, np.arange(8, dtype=np.uint64)))
    first.bind(frozenset({"a", "b", "c"}))
    later = InputRecord(path, "fed").view(3, "train", "m", one_round=True)
    assert later.stored is None and later.survivors is None
    later.keep(StoredAnswer(None, 1.0, np.arange(8, 16, dtype=np.uint64)))
    later.bind(frozenset({"a", "b"}))
    # Round 3 run again (a restart) is still round 3's input: its bits and its survivors.
    again = InputRecord(path, "fed").view(3, "train", "m", one_round=True)
    assert again.survivors == frozenset({"a", "b"})
    assert again.stored is not None and again.stored.encoded is not None
    assert again.stored.encoded.tolist() == list(range(8, 16))
    # Without noise the input is the model's, for good: still bound to the survivors it was signed for.
    plain = tmp_path / "site-2.fed.bindings.json"
    bound = InputRecord(plain, "fed", reset=True).view(2, "train", "m")
    bound.keep(StoredAnswer(None, 1.0, np.arange(8, dtype=np.uint64)))
    bound.bind(frozenset({"a", "b", "c"}))
    assert InputRecord(plain, "fed").view(3, "train", "m").survivors == frozenset({"a", "b", "c"})


def test_a_noised_input_never_signed_is_sent_again_in_a_later_round(tmp_path: Path) -> None:
    # A round aborted before any survivor set was signed unmasked no sum of the input: it is re-sent, not redrawn.
    path = record_path(tmp_path)
    InputRecord(path, "fed", reset=True).view(2, "train", "m", one_round=True).keep(
        StoredAnswer(None, 1.0, np.arange(8, dtype=np.uint64))
    )
    later = InputRecord(path, "fed").view(3, "train", "m", one_round=True).stored
    assert later is not None and later.encoded is not None and later.encoded.tolist() == list(range(8))


def test_a_version_1_record_is_still_read(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    path.write_text(json.dumps({"format": "fedfair-bindings", "latest": 4, "inputs": {"train:m": ["a", "b"]}}))
    record = InputRecord(path, "fed")
    assert record.latest == 4
    assert record.view(4, "train", "m").survivors == frozenset({"a", "b"})


DATA = {"csv": "/data/site-1.csv"}


def ledger_of(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "site-1.data.ledger.json", "site-1", DATA)


_CHARGING = """
import sys
from pathlib import Path
from fedfair.privacy import distributed
from fedfair.privacy.ledger import Charge, Ledger
from fedfair.runtime.collaborator.input_record import InputRecord

ledger = Ledger(Path(sys.argv[2]), "site-1", {"csv": "/data/site-1.csv"})
record = InputRecord(Path(sys.argv[1]), "fed", ledger=ledger)
release = distributed.Release("skellam", 1e6, 40.0, 10.0, 0.01)
for round_number in range(1, 100_000):
    record.charge(Charge("train", round_number, f"m{round_number}", release, 1e-5), 1e9)
    if round_number == 5:
        print("charging", flush=True)
"""


def test_the_ledger_survives_kill_9_mid_write_and_still_refuses_past_its_budget(tmp_path: Path) -> None:
    """A process charging the ledger as fast as it can is killed with SIGKILL: the file it leaves reads, holds
    every release charged up to some round and nothing else, and the next charge composes on top of it (and
    is refused past the budget, charging nothing)."""
    path = record_path(tmp_path)
    command = [sys.executable, "-c", _CHARGING, str(path), str(ledger_of(tmp_path).path)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "charging"
    time.sleep(0.3)
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    ledger = ledger_of(tmp_path)
    record = InputRecord(path, "fed", ledger=ledger)  # the record may count one charge fewer, never more
    rounds = [entry["round"] for entry in ledger.releases()]
    assert rounds == list(range(1, len(rounds) + 1)) and len(rounds) >= 5
    release = distributed.Release("skellam", 1e6, 40.0, 10.0, 0.01)
    spent = ledger.spent(1e-5)
    assert spent == pytest.approx(distributed.epsilon([dataclasses.replace(release, steps=len(rounds))], 1e-5))
    with pytest.raises(PrivacyBudgetError, match=f"on {len(rounds)} train answers") as refused:
        record.charge(Charge("train", len(rounds) + 1, "next", release, 1e-5), spent)
    assert refused.value.reason is BudgetReason.ANSWER_REFUSED
    assert len(ledger_of(tmp_path).releases()) == len(rounds)


RELEASE = distributed.Release("skellam", 1e6, 40.0, 10.0, 0.01)


def version_2_record(path: Path, rounds: int) -> dict[str, object]:
    """A record as fedfair wrote it before ledgers were per dataset: its releases inside it."""
    releases = [
        {"kind": "train", "round": r, "model": f"m{r}", "mechanism": "skellam", "mu": 1e6, "l1": 40.0, "l2": 10.0,
         "sampling_rate": 0.01, "addon": 0.0, "delta": 1e-5}
        for r in range(1, rounds + 1)
    ]  # fmt: skip
    document = {
        "format": "fedfair-bindings", "version": 2, "latest": rounds, "inputs": {}, "kept": {}, "trainings": rounds,
        "thresholds": {}, "releases": releases,
    }  # fmt: skip
    path.write_text(json.dumps(document))
    return document


def test_a_version_2_record_is_folded_into_the_ledger_once(tmp_path: Path) -> None:
    """The releases a per-federation record kept count in the site's ledger: folded once, however often the
    records are read, and the record is rewritten as version 4 without them."""
    old, other = tmp_path / "site-1.old.bindings.json", tmp_path / "site-1.other.bindings.json"
    version_2_record(old, 3)
    version_2_record(other, 2)
    ledger = ledger_of(tmp_path)
    assert fold_records(ledger, tmp_path, "site-1") == ["old", "other"]
    assert fold_records(ledger_of(tmp_path), tmp_path, "site-1") == []  # already version 4
    ledger = ledger_of(tmp_path)
    assert [(entry["federation"], entry["round"]) for entry in ledger.releases()] == [
        ("old", 1), ("old", 2), ("old", 3), ("other", 1), ("other", 2)
    ]  # fmt: skip
    assert ledger.spent(1e-5) == pytest.approx(distributed.epsilon([dataclasses.replace(RELEASE, steps=5)], 1e-5))
    written = json.loads(old.read_text())
    assert written["version"] == 4 and "releases" not in written and written["charged"] == 3
    assert written["ledger"] == ledger.path.name


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda document: document.pop("releases"), r"keys missing \['releases'\]"),
        (lambda document: document.update(version=1), r"version 1 record with keys .* unknown \[.*'releases'"),
        (lambda document: document.update(version=7), r"version 7, this fedfair reads 1 to 4"),
        (lambda document: document["releases"][1].update(mu=1e300), r"release 1 of federation fed: mu = 1e\+300"),
        (lambda document: document["releases"][0].pop("delta"), r"release 0 of federation fed: missing delta"),
    ],
)
def test_an_edited_version_2_record_is_refused_not_read_as_epsilon_0(
    tmp_path: Path, edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    """A removed key, a version number lowered to 1 (which never had releases), or a release out of range
    used to read as a smaller spend (or none); each is now refused, naming the file."""
    path = record_path(tmp_path)
    document = version_2_record(path, 3)
    edit(document)
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=message) as refused:
        InputRecord(path, "fed", ledger=ledger_of(tmp_path))
    assert str(path) in str(refused.value)
    assert not ledger_of(tmp_path).path.exists()  # nothing folded


def test_a_ledger_lost_or_rolled_back_beside_its_record_is_refused_unless_reset(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    record = InputRecord(path, "fed", ledger=ledger_of(tmp_path))
    for round_number in (1, 2):
        record.charge(Charge("train", round_number, f"m{round_number}", RELEASE, 1e-5), 1e9)
    saved = ledger_of(tmp_path).path.read_bytes()
    record.charge(Charge("train", 3, "m3", RELEASE, 1e-5), 1e9)
    ledger_of(tmp_path).path.write_bytes(saved)  # rolled back one charge
    with pytest.raises(ConfigError, match=r"charged 3 releases of federation fed to the privacy ledger .* holds 2"):
        InputRecord(path, "fed", ledger=ledger_of(tmp_path))
    ledger_of(tmp_path).path.unlink()
    with pytest.raises(ConfigError, match=r"holds 0: the ledger was lost"):
        InputRecord(path, "fed", ledger=ledger_of(tmp_path))
    ledger = ledger_of(tmp_path)
    ledger.reset("the disk failed; no backup")  # the operator's decision, on the record
    restarted = InputRecord(path, "fed", ledger=ledger)
    assert restarted.charge(Charge("train", 4, "m4", RELEASE, 1e-5), 1e9) == pytest.approx(
        distributed.epsilon([RELEASE], 1e-5)
    )  # fmt: skip
    assert InputRecord(path, "fed", ledger=ledger_of(tmp_path)).ledger is not None  # consistent again


def test_a_record_charged_to_other_data_is_refused(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    InputRecord(path, "fed", ledger=ledger_of(tmp_path)).charge(Charge("train", 1, "m1", RELEASE, 1e-5), 1e9)
    other = Ledger(tmp_path / "site-1.other.ledger.json", "site-1", {"csv": "/data/elsewhere.csv"})
    with pytest.raises(ConfigError, match=r"its data changed within a federation"):
        InputRecord(path, "fed", ledger=other)


JOINED = BoundData({TABLE_KEY: "a" * 64}, "the table at /data/site-1.csv")
"""The table a site joined with, as its record binds it."""
EXPORTED_AGAIN = BoundData({TABLE_KEY: "b" * 64}, "the table at /data/site-1.csv")
"""The same path holding other rows (30 patients fewer, say): another fingerprint."""


@pytest.mark.parametrize("noised", [False, True], ids=["no-ledger", "ledger"])
def test_a_record_refuses_a_table_other_than_the_one_it_joined_with(tmp_path: Path, noised: bool) -> None:
    """Issue 98: the record binds the data at its first write, whatever the plan charges, and a restart on other
    rows is `table-changed`, naming the table, both fingerprints and the fix, before the ledger's check (whose
    message, `local-bindings` ... from a backup, would send the operator to the wrong fix)."""
    path = record_path(tmp_path)
    record = InputRecord(path, "fed", ledger=ledger_of(tmp_path) if noised else None, data=JOINED)
    record.view(1, "train", "m1").keep(StoredAnswer(np.linspace(-1.0, 1.0, 8), 3.0, np.arange(8, dtype=np.uint64)))
    assert json.loads(path.read_text())["data"] == JOINED.identity
    assert InputRecord(path, "fed", data=JOINED).latest == 1  # the same rows: taken as they are
    other_ledger = Ledger(tmp_path / "site-1.other.ledger.json", "site-1", EXPORTED_AGAIN.identity)
    with pytest.raises(PermanentFailureError) as refused:
        InputRecord(path, "fed", ledger=other_ledger if noised else None, data=EXPORTED_AGAIN)
    message = str(refused.value)
    assert refused.value.failure is TABLE_CHANGED, message
    assert message.startswith(
        "table-changed: the table at /data/site-1.csv changed since this site joined federation fed (its fingerprint "
        f"was {'a' * 16}, it is {'b' * 16} now)"
    ), message
    assert "restore the table it joined with" in message and "backup" not in message


def test_a_record_of_before_binds_the_table_it_is_opened_with(tmp_path: Path) -> None:
    """A version 3 record (written before records bound their data) is read, and binds the data of its next
    start at its next write: from then on other rows are refused."""
    path = record_path(tmp_path)
    InputRecord(path, "fed").view(1, "train", "m1").keep(
        StoredAnswer(np.linspace(-1.0, 1.0, 8), 3.0, np.arange(8, dtype=np.uint64))
    )
    document = json.loads(path.read_text())
    del document["data"]
    path.write_text(json.dumps(document | {"version": 3}))
    InputRecord(path, "fed", data=JOINED).view(2, "train", "m2").keep(
        StoredAnswer(np.linspace(-1.0, 1.0, 8), 3.0, np.arange(8, dtype=np.uint64))
    )
    assert json.loads(path.read_text())["version"] == 4
    with pytest.raises(PermanentFailureError, match=r"^table-changed: "):
        InputRecord(path, "fed", data=EXPORTED_AGAIN)
