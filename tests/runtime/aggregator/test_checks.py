"""The aggregator's checks of an upload and of a decoded sum against the plan's [influence]:
agreed weights, never claimed ones, and the L2 bound on updates."""

from __future__ import annotations

import numpy as np
import pytest

from fedfair.core.errors import RefusedError, RoundAbortedError
from fedfair.runtime.aggregator.checks import SumOutcome, check_agreed_influence, screen_plain_update
from fedfair.runtime.plan.influence import InfluenceSettings


DECLARED = InfluenceSettings(weights="declared", sizes={"site-a": 2780, "site-b": 310, "site-c": 160}, update_norm=2.0)


def upload(weight: float, update: list[float]) -> tuple[np.ndarray, float]:
    """A plain training upload's values [w * delta, w * delta_c] for d = len(update) - 1 parameters, and w."""
    return np.array([weight * value for value in update], dtype=np.float32), weight


def test_a_plain_upload_must_carry_its_agreed_weight_and_lie_in_the_update_ball() -> None:
    screen = screen_plain_update(DECLARED, 0.1, parameters=2)
    screen("site-c", *upload(16.0, [1.2, 1.6, 0.0]))  # weight round(0.1 * 160), length exactly 2
    with pytest.raises(RefusedError, match=r"weight 1e\+06 is not the 16 the plan's \[influence\] agrees for site-c"):
        screen("site-c", *upload(1e6, [0.1, 0.1, 0.0]))
    with pytest.raises(RefusedError, match="not the 278"):
        screen("site-a", *upload(16.0, [0.1, 0.1, 0.0]))  # another site's weight is no better
    with pytest.raises(RefusedError, match=r"L2 norm 2\.5 exceeds the plan's \[influence\] update_norm = 2"):
        screen("site-c", *upload(16.0, [1.5, 2.0, 0.0]))
    # The control variates of drift correction follow the d + 1 update values: not part of the bound.
    screen("site-c", np.array([16.0 * 1.2, 16.0 * 1.6, 0.0, 16.0 * 50.0, 16.0 * 50.0, 16.0 * 50.0]), 16.0)
    screen_equal = screen_plain_update(InfluenceSettings(update_norm=0.2), 0.1, parameters=2)
    with pytest.raises(RefusedError, match="not the 1 "):
        screen_equal("site-a", *upload(278.0, [0.1, 0.1, 0.0]))


def outcome_of(weighted: list[float], total: float, contributors: tuple[str, ...], error: float = 0.0) -> SumOutcome:
    return SumOutcome(np.array(weighted), total, error, contributors)


def test_the_server_divides_by_the_agreed_total_and_voids_a_round_whose_total_is_claimed() -> None:
    both = ("site-b", "site-c")
    agreed = check_agreed_influence(outcome_of([0.0, 0.0, 0.0], 47.0, both), DECLARED, 0.1, parameters=2)
    assert agreed == 47.0
    # Within the encoding's rounding of the agreed total, a decoded total is the agreed one.
    assert check_agreed_influence(outcome_of([0.0, 0.0, 0.0], 47.0 + 1e-7, both, 1e-6), DECLARED, 0.1, 2) == 47.0
    with pytest.raises(RoundAbortedError, match=r"decoded total weight 1000031 is not the 47 .* site-b, site-c"):
        check_agreed_influence(outcome_of([0.0, 0.0, 0.0], 1e6 + 31.0, both), DECLARED, 0.1, parameters=2)


def test_a_secure_round_whose_mean_update_leaves_the_ball_is_void() -> None:
    both = ("site-b", "site-c")
    # The mean (a weighted sum over the agreed 47) of length exactly 2 passes; the control part is not bounded.
    check_agreed_influence(outcome_of([47.0 * 1.2, 47.0 * 1.6, 0.0, 1e6, 1e6, 1e6], 47.0, both), DECLARED, 0.1, 2)
    with pytest.raises(
        RoundAbortedError, match=r"decoded mean update is 2\.1 long, beyond the plan's \[influence\] update_norm = 2"
    ):
        check_agreed_influence(outcome_of([47.0 * 2.1, 0.0, 0.0], 47.0, both), DECLARED, 0.1, parameters=2)
