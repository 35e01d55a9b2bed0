"""The round driver's exclusion policy: who is left out of later rounds after a round names culprits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedfair.runtime.aggregator.board import UploadRefused
from fedfair.runtime.aggregator.driver import (
    DriverSettings,
    RoundAborted,
    SumDriver,
    SumOutcome,
    check_agreed_influence,
    screen_plain_update,
)
from fedfair.runtime.influence import InfluenceSettings
from fedfair.runtime.aggregator.loop import excluded_in
from tests.secagg.helpers import Harness, make_config
from tests.secagg.test_active import garbage_shares

NO_NETWORK: Any = None
"""The policy needs neither the board nor the gate."""


def driver(max_colluding: int) -> SumDriver:
    settings = DriverSettings("test-federation", True, None, None, max_colluding, 30.0)
    return SumDriver(NO_NETWORK, NO_NETWORK, settings, NO_NETWORK)


def accused_by(accusers: list[int], liar: int = 3) -> Harness:
    """A five-party round up to the masking set where `accusers` received garbage shares from `liar`."""
    harness = Harness(make_config(5, max_colluding=1))
    harness.advertise()
    directory = harness.server.key_directory()
    for party, client in harness.clients.items():
        message = client.share_keys(directory)
        if party == liar:
            honest_entries = {entry.recipient: entry for entry in message.shares}
            garbage = garbage_shares(harness, liar, message)
            entries = tuple(
                entry if entry.recipient in accusers else honest_entries[entry.recipient] for entry in garbage.shares
            )
            message = type(message)(message.header, message.sender, entries)
        harness.server.receive_shares(message)
    harness.check(harness.server.share_bundles())
    harness.server.masking_set()
    return harness


@pytest.mark.parametrize(("accusers", "excluded"), [([1], False), ([1, 2], True), ([1, 2, 4, 5], True)])
def test_an_accused_party_is_excluded_only_when_more_than_max_colluding_accuse_it(
    accusers: list[int], excluded: bool
) -> None:
    # With max_colluding = 1 a single accuser may be the liar; two cannot both be.
    harness = accused_by(accusers)
    named = driver(max_colluding=1)._named(2, harness.config, harness.server)
    assert ("site-3" in named) is excluded


def test_exclusions_are_rebuilt_from_the_round_log_on_resume() -> None:
    records = [
        {"round": 1, "status": "applied"},
        {"round": 2, "status": "aborted", "excluded": {"site-3": "sent a bad unmask share"}},
        {"round": 3, "status": "applied", "evaluation": {"status": "done", "excluded": {"site-4": "accused"}}},
    ]
    assert excluded_in(records) == {"site-3": "sent a bad unmask share", "site-4": "accused"}


DECLARED = InfluenceSettings(weights="declared", sizes={"site-a": 2780, "site-b": 310, "site-c": 160}, update_norm=2.0)


def upload(weight: float, update: list[float]) -> np.ndarray:
    """A plain training upload: [w * delta, w * delta_c, w] for d = len(update) - 1 parameters."""
    return np.array([weight * value for value in update] + [weight])


def test_a_plain_upload_must_carry_its_agreed_weight_and_lie_in_the_update_ball() -> None:
    screen = screen_plain_update(DECLARED, 0.1, parameters=2)
    screen("site-c", upload(16.0, [1.2, 1.6, 0.0]))  # weight round(0.1 * 160), length exactly 2
    with pytest.raises(UploadRefused, match=r"weight 1e\+06 is not the 16 the plan's \[influence\] agrees for site-c"):
        screen("site-c", upload(1e6, [0.1, 0.1, 0.0]))
    with pytest.raises(UploadRefused, match="not the 278"):
        screen("site-a", upload(16.0, [0.1, 0.1, 0.0]))  # another site's weight is no better
    with pytest.raises(UploadRefused, match=r"L2 norm 2\.5 exceeds the plan's \[influence\] update_norm = 2"):
        screen("site-c", upload(16.0, [1.5, 2.0, 0.0]))
    # The control variates of drift correction follow the d + 1 update values: not part of the bound.
    screen("site-c", np.array([16.0 * 1.2, 16.0 * 1.6, 0.0, 16.0 * 50.0, 16.0 * 50.0, 16.0 * 50.0, 16.0]))
    screen_equal = screen_plain_update(InfluenceSettings(update_norm=0.2), 0.1, parameters=2)
    with pytest.raises(UploadRefused, match="not the 1 "):
        screen_equal("site-a", upload(278.0, [0.1, 0.1, 0.0]))


def outcome_of(weighted: list[float], total: float, contributors: tuple[str, ...], error: float = 0.0) -> SumOutcome:
    return SumOutcome(np.array(weighted), total, error, contributors)


def test_the_server_divides_by_the_agreed_total_and_voids_a_round_whose_total_is_claimed() -> None:
    both = ("site-b", "site-c")
    agreed = check_agreed_influence(outcome_of([0.0, 0.0, 0.0], 47.0, both), DECLARED, 0.1, parameters=2)
    assert agreed == 47.0
    # Within the encoding's rounding of the agreed total, a decoded total is the agreed one.
    assert check_agreed_influence(outcome_of([0.0, 0.0, 0.0], 47.0 + 1e-7, both, 1e-6), DECLARED, 0.1, 2) == 47.0
    with pytest.raises(RoundAborted, match=r"decoded total weight 1000031 is not the 47 .* site-b, site-c"):
        check_agreed_influence(outcome_of([0.0, 0.0, 0.0], 1e6 + 31.0, both), DECLARED, 0.1, parameters=2)


def test_a_secure_round_whose_mean_update_leaves_the_ball_is_void() -> None:
    both = ("site-b", "site-c")
    # The mean (a weighted sum over the agreed 47) of length exactly 2 passes; the control part is not bounded.
    check_agreed_influence(outcome_of([47.0 * 1.2, 47.0 * 1.6, 0.0, 1e6, 1e6, 1e6], 47.0, both), DECLARED, 0.1, 2)
    with pytest.raises(RoundAborted, match=r"decoded mean update is 2\.1 long, beyond the plan's \[influence\] update_norm = 2"):
        check_agreed_influence(outcome_of([47.0 * 2.1, 0.0, 0.0], 47.0, both), DECLARED, 0.1, parameters=2)
