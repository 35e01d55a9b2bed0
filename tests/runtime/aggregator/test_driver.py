"""The round driver's exclusion policy: who is left out of later rounds after a round names culprits."""

from __future__ import annotations

from typing import Any

import pytest

from fedfair.runtime.aggregator.driver import DriverSettings, SumDriver
from fedfair.runtime.aggregator.loop import excluded_in
from fedfair.secagg import SecurityParameters
from tests.secagg.helpers import Harness, make_config
from tests.secagg.test_active import garbage_shares

NO_NETWORK: Any = None
"""The policy needs neither the board nor the gate."""


def driver(max_colluding: int) -> SumDriver:
    settings = DriverSettings("test-federation", True, SecurityParameters(max_colluding), 30.0)
    return SumDriver(NO_NETWORK, NO_NETWORK, settings, NO_NETWORK)


def accused_by(accusers: list[int], liar: int = 3) -> Harness:
    """A five-party round up to the masking set where `accusers` received garbage shares from `liar`."""
    harness = Harness(make_config(5, max_colluding=1))
    harness.advertise()
    directory = harness.server.key_directory()
    for party, client in harness.clients.items():
        message = client.share_keys(directory)
        if party == liar:
            message = garbage_shares(harness, liar, message, accusers)
        harness.server.receive_shares(message)
    harness.check(harness.server.share_bundles())
    harness.server.masking_set()
    return harness


@pytest.mark.parametrize(("accusers", "excluded"), [([1], False), ([1, 2], True), ([1, 2, 4, 5], True)])
def test_an_accused_party_is_excluded_only_when_more_than_max_colluding_accuse_it(
    accusers: list[int], excluded: bool
) -> None:
    # With max_colluding = 1 a single accuser may be the liar; two cannot both be. The bound is the sum's own
    # (its config's security parameters): a driver holding another cannot loosen the rule.
    harness = accused_by(accusers)
    assert harness.config.security.max_colluding == 1
    for driver_bound in (0, 1):
        named = driver(driver_bound)._named(2, harness.config, harness.server)
        assert ("site-3" in named) is excluded


def test_exclusions_are_rebuilt_from_the_round_log_on_resume() -> None:
    records = [
        {"round": 1, "status": "applied"},
        {"round": 2, "status": "aborted", "excluded": {"site-3": "sent a bad unmask share"}},
        {"round": 3, "status": "applied", "evaluation": {"status": "done", "excluded": {"site-4": "accused"}}},
    ]
    assert excluded_in(records) == {"site-3": "sent a bad unmask share", "site-4": "accused"}
