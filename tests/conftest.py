"""Shared fixtures: real federations cut from the bundled Adult data; the Hypothesis profile."""

from __future__ import annotations

import os

# gRPC's C core reads this once, when it starts: set before any test imports grpc, so its own lines
# ("Got goaway", connectivity traces) stay out of the suite's output, as fedfair's processes keep
# them out of theirs (fedfair.runtime.logs.quiet_grpc).
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import pytest  # noqa: E402
from hypothesis import settings

from fedfair.simulation.federation import Federation
from tests.federations import adult_by_race

# Property tests assert properties, not speed: on a shared, loaded machine one example can take
# longer than Hypothesis' default 200 ms deadline and fail a correct test (it did, at 309 ms).
# Speed targets live in benchmarks/.
settings.register_profile("fedfair", deadline=None)
settings.load_profile("fedfair")


@pytest.fixture(scope="session")
def adult_federation() -> Federation:
    """The full Adult federation by race (uneven: most rows are in the White client)."""
    return adult_by_race()


@pytest.fixture(scope="session")
def small_adult_federation() -> Federation:
    """A few hundred Adult rows per client with deliberately uneven sizes, for exactness tests."""
    return adult_by_race((600, 250, 120))
