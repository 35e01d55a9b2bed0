"""Shared fixtures: real federations cut from the bundled Adult data."""

from __future__ import annotations

import pytest

from fedfair.research.simulation import Federation
from tests.federations import adult_by_race


@pytest.fixture(scope="session")
def adult_federation() -> Federation:
    """The full Adult federation by race (uneven: most rows are in the White client)."""
    return adult_by_race()


@pytest.fixture(scope="session")
def small_adult_federation() -> Federation:
    """A few hundred Adult rows per client with deliberately uneven sizes, for exactness tests."""
    return adult_by_race((600, 250, 120))
