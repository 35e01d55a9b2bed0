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
    path = privacy_state_path(tmp_path / "collab.pt")
    assert path.name == "collab.privacy.json"
    accountant = PrivacyAccountant(path)
    for _ in range(4):
        accountant.spend(1.1, 0.02, 5)
    for mechanism in ("prv", "rdp"):
        assert accountant.epsilon(DELTA, mechanism) == compute_epsilon(1.1, 0.02, 20, DELTA, mechanism)
    restarted = PrivacyAccountant(path)
    assert (restarted.rounds, restarted.steps, restarted.history) == (4, 20, [(1.1, 0.02, 20)])
    assert restarted.epsilon(DELTA, "rdp") == accountant.epsilon(DELTA, "rdp")


def test_accountant_refuses_an_unreadable_state_file(tmp_path: Path) -> None:
    path = tmp_path / "collab.privacy.json"
    path.write_text('{"format": "fedfair-privacy-accountant", "version": 1, "rounds": 2, "history": [[1.0, 2.0, 3]]}')
    with pytest.raises(ConfigError, match="unreadable.*restore it"):
        PrivacyAccountant(path)
