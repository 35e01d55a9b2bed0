"""The collaborator's record: one input per model, kept bits, and state that never silently resets."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedfair.core.errors import BudgetReason, ConfigError, PermanentFailureError, PrivacyBudgetError, RefusedError
from fedfair.privacy import distributed
from fedfair.runtime.collaborator.input_record import InputRecord, Kept


def record_path(tmp_path: Path) -> Path:
    return tmp_path / "site-1.fed.bindings.json"


def answered(path: Path, round_number: int, kind: str = "train", model: str = "m", **kwargs: bool) -> Kept:
    """Answer (kind, round, model) with fresh bits, kept as a real round keeps them; return those bits."""
    encoded = np.frombuffer(np.random.default_rng(round_number).bytes(64), dtype=np.uint64).copy()
    kept = Kept(np.linspace(-1.0, 1.0, 8), 3.0, encoded)
    InputRecord(path, "fed", **kwargs).view(round_number, kind, model).keep(kept)
    return kept


def test_the_same_request_gets_the_same_bits_after_a_restart(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    first = answered(path, 2, reset=True)
    again = InputRecord(path, "fed").view(2, "train", "m").kept
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
    assert InputRecord(path, "fed").view(2, "evaluate", "m-plus-one-ulp").kept is None


def test_a_model_carried_into_a_later_round_gets_the_same_bits(tmp_path: Path) -> None:
    # An aborted round leaves the model unchanged: the next round carries it again.
    path = record_path(tmp_path)
    first = answered(path, 2, reset=True)
    again = InputRecord(path, "fed").view(3, "train", "m").kept
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
    assert record.view(3, "train", "b").kept is not None
    with pytest.raises(
        PermanentFailureError, match="federation-past: .* round 3 of federation fed .* now serves round 2"
    ):
        record.view(2, "train", "a")


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
    assert InputRecord(path, "fed").view(1, "train", "m").kept is None  # a federation's first round
    assert InputRecord(path, "fed", reset=True).view(5, "train", "m").kept is None


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


def test_composition_takes_c_from_the_training_rounds(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    record = InputRecord(path, "fed")
    assert record.composition_threshold(1) is None
    for round_number, c in ((1, 0.9), (2, 0.5), (3, 0.3)):
        record.note_threshold(round_number, c)
        record.view(round_number, "train", f"model-{round_number}").keep(Kept(np.zeros(2), 1.0))
    restarted = InputRecord(path, "fed")
    assert restarted.composition_threshold(2) == pytest.approx(0.4, abs=1e-15)
    assert restarted.composition_threshold(9) == pytest.approx((0.9 + 0.5 + 0.3) / 3, abs=1e-15)


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


def test_a_version_1_record_is_still_read(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    path.write_text(json.dumps({"format": "fedfair-bindings", "latest": 4, "inputs": {"train:m": ["a", "b"]}}))
    record = InputRecord(path, "fed")
    assert record.latest == 4
    assert record.view(4, "train", "m").survivors == frozenset({"a", "b"})


_CHARGING = """
import sys
from pathlib import Path
from fedfair.privacy import distributed
from fedfair.runtime.collaborator.input_record import InputRecord

record = InputRecord(Path(sys.argv[1]), "fed")
release = distributed.Release("skellam", 1e6, 40.0, 10.0, 0.01)
for round_number in range(1, 100_000):
    record.charge("train", round_number, f"m{round_number}", release, 1e-5, 1e9)
    if round_number == 5:
        print("charging", flush=True)
"""


def test_the_ledger_survives_kill_9_mid_write_and_still_refuses_past_its_budget(tmp_path: Path) -> None:
    """A process charging the ledger as fast as it can is killed with SIGKILL: the file it leaves reads, holds
    every release charged up to some round and nothing else, and the next charge composes on top of it (and
    is refused past the budget, charging nothing)."""
    path = record_path(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", _CHARGING, str(path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "charging"
    time.sleep(0.3)
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    record = InputRecord(path, "fed")
    rounds = [entry["round"] for entry in record.ledger()]
    assert rounds == list(range(1, len(rounds) + 1)) and len(rounds) >= 5
    release = distributed.Release("skellam", 1e6, 40.0, 10.0, 0.01)
    spent = record.spent(1e-5)
    assert spent == pytest.approx(distributed.epsilon([dataclasses.replace(release, steps=len(rounds))], 1e-5))
    with pytest.raises(PrivacyBudgetError, match=f"on {len(rounds)} train answers") as refused:
        record.charge("train", len(rounds) + 1, "next", release, 1e-5, spent)
    assert refused.value.reason is BudgetReason.ANSWER_REFUSED
    assert len(InputRecord(path, "fed").ledger()) == len(rounds)
