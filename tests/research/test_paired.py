"""Paired gaps on shared rows: the standard error is that of the gap over fresh rows drawn alike."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.core.objective import cvar, cvar_terms
from fedfair.research.paired import paired_gap, paired_rows
from fedfair.research.runs import Run, row_losses


@settings(max_examples=200, deadline=None)
@given(
    losses=st.lists(st.floats(min_value=0.0, max_value=20.0), min_size=1, max_size=80),
    rho=st.floats(min_value=0.01, max_value=1.0),
)
def test_the_terms_mean_is_the_exact_cvar(losses: list[float], rho: float) -> None:
    values = np.array(losses)
    assert float(cvar_terms(values, rho).mean()) == pytest.approx(cvar(values, rho), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("rho", [0.1, 0.5])
def test_the_standard_error_is_the_gaps_spread_over_fresh_rows(rho: float) -> None:
    # Two models' losses on rows drawn from one population, correlated as two fits of the same data are. The
    # gap's spread over 400 independent draws of n rows must match the error each draw states: the std of
    # 400 draws is itself within about 1 / sqrt(2 * 400) = 3.5% of the truth, the delta method's bias at n =
    # 4,000 is smaller, so 15% is four of those spreads.
    generator = np.random.default_rng(7)
    n, draws = 4_000, 400
    gaps, errors = [], []
    for _ in range(draws):
        shared = generator.exponential(1.0, n)
        first = shared + 0.2 * generator.exponential(1.0, n)
        second = 0.9 * shared + 0.3 * generator.exponential(1.0, n)
        gap, error = paired_gap([first], [second], rho)
        gaps.append(gap)
        errors.append(error)
    assert float(np.std(gaps, ddof=1)) == pytest.approx(float(np.mean(errors)), rel=0.15)


def test_a_gap_is_the_mean_over_seeds_of_the_risk_difference() -> None:
    generator = np.random.default_rng(3)
    reference = [generator.exponential(1.0, 500) for _ in range(2)]
    other = [vector + 0.1 for vector in reference]  # every row 0.1 worse: the gap is 0.1, with no doubt
    gap, error = paired_gap(reference, other, 0.3)
    assert gap == pytest.approx(0.1, abs=1e-12)
    assert error < 1e-12
    with pytest.raises(ConfigError, match="same rows"):
        paired_gap(reference, [reference[0][:10]], 0.3)


def result_of(losses: np.ndarray) -> dict[str, object]:
    """A test run's result as `runs.execute` keeps it with `row_losses`."""
    import base64

    return {"row_losses": base64.b64encode(losses.astype("<f4").tobytes()).decode("ascii")}


def test_rows_pair_every_method_with_fedsrcvar_at_its_rho_and_leave_diverged_seeds_out() -> None:
    generator = np.random.default_rng(5)
    mine = generator.exponential(1.0, 300).astype(np.float32)
    chosen = {
        ("fedsrcvar", 0.1): [result_of(mine)],
        ("fedavg", 0.1): [result_of(mine + 1), {"diverged": "NaN"}],
        ("term", 0.1): [{"diverged": "NaN"}],
    }
    rows = paired_rows(chosen, {"fedavg": "FedAvg", "term": "TERM"})
    assert [(row["method"], row["seeds"]) for row in rows] == [("FedAvg", 1), ("TERM", 0)]
    assert rows[0]["gap_to_fedsrcvar"] == pytest.approx(1.0, abs=1e-5)
    assert math.isnan(rows[1]["gap_to_fedsrcvar"])


def test_a_run_keeps_row_losses_only_when_asked_and_says_so_otherwise() -> None:
    asked = Run(("--seed", "1"), "test", row_losses=True)
    assert asked.key != Run(("--seed", "1"), "test").key
    with pytest.raises(ConfigError, match="row_losses=True"):
        row_losses({"worst_risk": 0.5})
    losses = np.array([0.25, 1.5], dtype=np.float32)
    assert row_losses(result_of(losses)).tolist() == [0.25, 1.5]
