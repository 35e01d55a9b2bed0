"""Shared fixtures: real federations cut from the bundled Adult data; the Hypothesis profile."""

from __future__ import annotations

import os

# gRPC's C core reads this once, when it starts: set before any test imports grpc, so its own lines
# ("Got goaway", connectivity traces) stay out of the suite's output, as fedfair's processes keep
# them out of theirs (fedfair.runtime.logs.quiet_grpc).
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
# One thread per torch (here and, inherited, in every process a test starts), as fedfair's own processes
# run: the suite's workers already fill the cores, and a torch spreading each operation over all of them
# makes threads contend and spin. Measured on 2 cores: test_rounds.py's two heaviest tests took 36 CPU-s
# on torch's default threads, 21 on one. Set before anything imports torch, which reads it once.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

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
