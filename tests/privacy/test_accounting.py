"""Accounting across rounds: one history per collaborator, persisted, and refused when unreadable."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
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


def _exact_epsilon(sigma: float, sample_rate: float, steps: int, delta: float) -> float:
    """The epsilon at `delta` of `steps` DP-SGD steps, from the privacy loss distribution itself (no accountant).

    One step of the Poisson-subsampled Gaussian (clip 1): P = (1 - q) N(0, sigma^2) + q N(1, sigma^2) against
    Q = N(0, sigma^2); the loss log P/Q, integrated on a fine grid and rounded to 1e-4, is composed `steps` times by
    FFT, and delta(epsilon) = E[(1 - e^(epsilon - loss))+] is solved for, the larger of the two directions.
    """
    from scipy.stats import norm

    points = np.linspace(-12.0 * sigma, 12.0 * sigma + 1.0, 1_000_001)
    loss = np.log1p(sample_rate * np.expm1((2.0 * points - 1.0) / (2.0 * sigma**2)))
    mixture = (1.0 - sample_rate) * norm.pdf(points, 0.0, sigma) + sample_rate * norm.pdf(points, 1.0, sigma)
    width, size = 1e-4, 800_000  # losses in [-40, 40): the composed tails beyond hold far less than delta
    worst = 0.0
    for mass, values in ((mixture, loss), (norm.pdf(points, 0.0, sigma), -loss)):
        grid = np.zeros(size)
        np.add.at(grid, np.rint(values / width).astype(np.int64) % size, mass / mass.sum())
        composed = np.fft.irfft(np.fft.rfft(grid) ** steps, n=size)
        index = np.arange(size)
        levels = np.where(index < size // 2, index, index - size) * width

        def delta_at(epsilon: float, composed: np.ndarray = composed, levels: np.ndarray = levels) -> float:
            above = levels > epsilon
            return float(np.sum(composed[above] * -np.expm1(epsilon - levels[above])))

        low, high = 0.0, 20.0
        for _ in range(50):
            middle = (low + high) / 2.0
            low, high = (middle, high) if delta_at(middle) > delta else (low, middle)
        worst = max(worst, high)
    return worst


def test_dp_sgd_epsilon_is_the_exact_privacy_loss_distributions_to_within_the_prv_error() -> None:
    """The computation above is exact where a closed form exists: without sampling, T steps of noise multiplier
    sigma are the Gaussian mechanism of mu = sqrt(T) / sigma, delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu -
    mu/2) (Balle and Wang 2018). The PRV accountant's epsilon for issue 93's 100 steps at sigma 1, q 0.01 (0.728)
    is then an upper bound on the exact one, within 2 x its 0.01 error; RDP's is a looser upper bound."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    mu = math.sqrt(10) / 5.0
    closed = brentq(lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - DELTA, 0, 50)
    assert _exact_epsilon(5.0, 1.0, 10, DELTA) == pytest.approx(closed, abs=1e-4)
    exact = _exact_epsilon(1.0, 0.01, 100, DELTA)
    prv = compute_epsilon(1.0, 0.01, 100, DELTA)
    assert prv == pytest.approx(0.728, abs=5e-4)
    assert exact <= prv <= exact + 0.02, (exact, prv)
    assert compute_epsilon(1.0, 0.01, 100, DELTA, "rdp") >= exact
