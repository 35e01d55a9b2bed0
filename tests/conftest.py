"""Shared fixtures: real federations cut from the bundled Adult data; the Hypothesis profile; the root logger kept."""

from __future__ import annotations

import os

# gRPC's C core reads this once, when it starts: set before any test imports grpc, so its own lines
# ("Got goaway", connectivity traces) stay out of the suite's output, as fedfair's processes keep
# them out of theirs (fedfair.runtime.observe.logs.quiet_grpc).
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import logging  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Iterator  # noqa: E402

# A privacy ledger follows an institution's data wherever its folder is, in the user's state folder
# (fedfair.privacy.ledger_home): the suite's federations reuse site names and data, so each test (and each
# module's shared federations) gets a ledger folder of its own, never the user's.
os.environ["FEDFAIR_LEDGER_DIR"] = tempfile.mkdtemp(prefix="fedfair-test-ledgers-")

import pytest  # noqa: E402
import torch
from hypothesis import settings

from fedfair.runtime.local.forkserver import stop_shared_forkserver
from fedfair.runtime.observe.logs import Console, LogFile
from fedfair.simulation.federation import Federation
from tests.federations import adult_by_race

# Property tests assert properties, not speed: on a shared, loaded machine one example can take
# longer than Hypothesis' default 200 ms deadline and fail a correct test (it did, at 309 ms).
# Speed targets live in benchmarks/.
settings.register_profile("fedfair", deadline=None)
settings.load_profile("fedfair")

# One torch thread in the suite's processes, as fedfair's own processes run (runtime.local.processes,
# research.runs): the suite's workers already fill the cores, and a torch spreading each operation over
# all of them makes its threads contend and spin. On 2 shared cores, test_rounds.py's two heaviest tests
# took 36 CPU-s on torch's default threads and 21 on one. Torch's threads only: numpy's BLAS keeps its
# own, since test_baselines.py's SLSQP solve depends on its summation order.
torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def _module_ledger_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDFAIR_LEDGER_DIR", str(tmp_path_factory.mktemp("module-ledgers")))
        yield


@pytest.fixture(autouse=True)
def _ledger_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDFAIR_LEDGER_DIR", str(tmp_path_factory.mktemp("ledgers")))


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """After each test, the root logger without the handlers fedfair's commands install (`configure_logging`):
    each writes to that test's captured streams, which later tests' threads must not write to once closed.
    pytest's own capture handlers come and go with each phase, so only fedfair's are removed."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in list(root.handlers):
        if isinstance(handler, (Console, LogFile)):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


@pytest.fixture(scope="session")
def adult_federation() -> Federation:
    """The full Adult federation by race (uneven: most rows are in the White client)."""
    return adult_by_race()


@pytest.fixture(scope="session")
def small_adult_federation() -> Federation:
    """A few hundred Adult rows per client with deliberately uneven sizes, for exactness tests."""
    return adult_by_race((600, 250, 120))


def pytest_sessionfinish() -> None:
    """Stop this worker's forkserver (fedfair.runtime.local.forkserver) once its parties exit: their CPU time is then
    counted in the suite's own, as a fresh interpreter's would be."""
    stop_shared_forkserver()
