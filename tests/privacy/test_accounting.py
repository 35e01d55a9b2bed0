"""Accounting across rounds: one history per collaborator, persisted, and refused when unreadable."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedfair.core.errors import ConfigError
from fedfair.privacy.accounting import (
    UNRECORDED,
    PrivacyAccountant,
    compute_epsilon,
    open_accountant,
    privacy_state_path,
)
from tests.privacy.helpers import DELTA


DATA = {"csv": "/data/collab.csv"}


def test_cumulative_epsilon_over_rounds_equals_one_run_and_survives_restart(tmp_path: Path) -> None:
    path = privacy_state_path(tmp_path, "collab", DATA)
    assert path.name.startswith("collab.") and path.name.endswith(".privacy.json")
    assert path != privacy_state_path(tmp_path, "collab", {"csv": "/data/other.csv"})
    accountant = PrivacyAccountant(path, federation="federation-1", data=DATA)
    for _ in range(4):
        accountant.spend(1.1, 0.02, 5)
    for mechanism in ("prv", "rdp"):
        assert accountant.epsilon(DELTA, mechanism) == compute_epsilon(1.1, 0.02, 20, DELTA, mechanism)
    restarted = PrivacyAccountant(path, federation="federation-1", data=DATA)
    assert (restarted.rounds, restarted.steps, restarted.history) == (4, 20, [(1.1, 0.02, 20)])
    assert restarted.epsilon(DELTA, "rdp") == accountant.epsilon(DELTA, "rdp")


def test_accountant_refuses_an_unreadable_state_file(tmp_path: Path) -> None:
    path = tmp_path / "collab.privacy.json"
    path.write_text('{"format": "fedfair-privacy-accountant", "version": 1, "rounds": 2, "history": [[1.0, 2.0, 3]]}')
    with pytest.raises(ConfigError, match="unreadable.*restore it"):
        PrivacyAccountant(path)


def test_every_federation_spends_the_datas_one_history(tmp_path: Path) -> None:
    """Joining another federation with the same data continues its history; each federation's rounds are its
    own (what its record is checked against), and the epsilon is over all of them."""
    first = PrivacyAccountant(privacy_state_path(tmp_path, "collab", DATA), federation="federation-1", data=DATA)
    first.spend(1.0, 0.05, 10)
    second = PrivacyAccountant(privacy_state_path(tmp_path, "collab", DATA), federation="federation-2", data=DATA)
    assert (second.rounds, second.history) == (0, [(1.0, 0.05, 10)])
    second.spend(1.0, 0.05, 3)
    again = PrivacyAccountant(privacy_state_path(tmp_path, "collab", DATA), federation="federation-1", data=DATA)
    assert (again.rounds, again.steps) == (1, 13)
    assert again.epsilon(DELTA) == compute_epsilon(1.0, 0.05, 13, DELTA)
    with pytest.raises(ConfigError, match="is of the data"):
        PrivacyAccountant(privacy_state_path(tmp_path, "collab", DATA), data={"csv": "/data/other.csv"})


def test_per_federation_files_of_before_are_folded_in_once(tmp_path: Path) -> None:
    (tmp_path / "collab.federation-1.privacy.json").write_text(
        '{"format": "fedfair-privacy-accountant", "version": 2, "federation": "federation-1", "rounds": 2, '
        '"history": [[1.0, 0.5, 3]]}'
    )
    (tmp_path / "collab.privacy.json").write_text(
        '{"format": "fedfair-privacy-accountant", "version": 1, "rounds": 1, "history": [[1.0, 0.5, 1]]}'
    )
    accountant, folded = open_accountant(tmp_path, "collab", DATA, "federation-2")
    assert folded == ["federation-1", UNRECORDED] and (accountant.rounds, accountant.steps) == (0, 4)
    again, folded = open_accountant(tmp_path, "collab", DATA, "federation-1")
    assert folded == [] and (again.rounds, again.steps) == (2, 4)
    (tmp_path / "collab.federation-3.privacy.json").write_text(
        '{"format": "fedfair-privacy-accountant", "version": 2, "federation": "elsewhere", "rounds": 1, '
        '"history": [[1.0, 0.5, 1]]}'
    )
    with pytest.raises(ConfigError, match=r"collab.federation-3.privacy.json is unreadable \(it records federation"):
        open_accountant(tmp_path, "collab", DATA, "federation-1")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda state: state.update(history=[]), "its sha256 is not the digest of its content"),
        (lambda state: state["history"][0].__setitem__(0, 1e300), "its sha256 is not the digest"),
        (lambda state: state.pop("rounds"), "exactly the keys"),
        (lambda state: state.update(version=2), "not a version 3 state"),
    ],
)
def test_an_edited_accountant_state_is_refused(
    tmp_path: Path, edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    """An emptied history, a noise raised to make the spend look small, a removed key or a lowered version
    used to read as a smaller epsilon (or none): each is refused, naming the file."""
    path = privacy_state_path(tmp_path, "collab", DATA)
    PrivacyAccountant(path, federation="f", data=DATA).spend(1.0, 0.05, 10)
    state = json.loads(path.read_text())
    edit(state)
    path.write_text(json.dumps(state))
    with pytest.raises(ConfigError, match=f"{path} is unreadable .*{message}"):
        PrivacyAccountant(path, federation="f", data=DATA)
