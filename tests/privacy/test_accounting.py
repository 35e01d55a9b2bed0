"""Accounting across rounds: one history per collaborator, persisted, and refused when unreadable."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.privacy.accounting import (
    PrivacyAccountant,
    compute_epsilon,
    privacy_state_path,
)
from tests.privacy.helpers import DELTA


def test_cumulative_epsilon_over_rounds_equals_one_run_and_survives_restart(tmp_path: Path) -> None:
    path = privacy_state_path(tmp_path, "collab", "federation-1")
    assert path.name == "collab.federation-1.privacy.json"
    accountant = PrivacyAccountant(path, federation="federation-1")
    for _ in range(4):
        accountant.spend(1.1, 0.02, 5)
    for mechanism in ("prv", "rdp"):
        assert accountant.epsilon(DELTA, mechanism) == compute_epsilon(1.1, 0.02, 20, DELTA, mechanism)
    restarted = PrivacyAccountant(path, federation="federation-1")
    assert (restarted.rounds, restarted.steps, restarted.history) == (4, 20, [(1.1, 0.02, 20)])
    assert restarted.epsilon(DELTA, "rdp") == accountant.epsilon(DELTA, "rdp")


def test_accountant_refuses_an_unreadable_state_file(tmp_path: Path) -> None:
    path = tmp_path / "collab.privacy.json"
    path.write_text('{"format": "fedfair-privacy-accountant", "version": 1, "rounds": 2, "history": [[1.0, 2.0, 3]]}')
    with pytest.raises(ConfigError, match="unreadable.*restore it"):
        PrivacyAccountant(path)


def test_each_federation_has_its_own_history(tmp_path: Path) -> None:
    """Joining another federation starts afresh; a file of one federation is never counted in another."""
    first = PrivacyAccountant(privacy_state_path(tmp_path, "collab", "federation-1"), federation="federation-1")
    first.spend(1.0, 0.05, 10)
    second = PrivacyAccountant(privacy_state_path(tmp_path, "collab", "federation-2"), federation="federation-2")
    assert (second.rounds, second.history) == (0, [])
    second.spend(1.0, 0.05, 3)
    again = PrivacyAccountant(privacy_state_path(tmp_path, "collab", "federation-1"), federation="federation-1")
    assert again.history == [(1.0, 0.05, 10)]
    with pytest.raises(ConfigError, match="belongs to federation 'federation-1', not 'federation-2'"):
        PrivacyAccountant(privacy_state_path(tmp_path, "collab", "federation-1"), federation="federation-2")


def test_a_version_1_file_put_at_a_federations_path_is_that_federations(tmp_path: Path) -> None:
    path = privacy_state_path(tmp_path, "collab", "federation-1")
    path.write_text('{"format": "fedfair-privacy-accountant", "version": 1, "rounds": 2, "history": [[1.0, 0.5, 3]]}')
    accountant = PrivacyAccountant(path, federation="federation-1")
    assert (accountant.rounds, accountant.history) == (2, [(1.0, 0.5, 3)])
    accountant.spend(1.0, 0.5, 1)
    assert PrivacyAccountant(path, federation="federation-1").steps == 4  # rewritten as version 2, keyed
