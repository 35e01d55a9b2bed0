"""A short seeded run's final numbers, pinned: moving code around must not change what it computes.

The values were produced by the code before the three-layer restructure (commit b5a952f) with
the pinned torch CPU build; a seeded run is deterministic on one machine, so they must match
to the last bits here. The tolerance only admits the last-ulp differences another CPU's
vector units can introduce in summations, far below any change of behaviour. The run takes
Algorithm 1's server step (`--server-momentum 0`), as every run did when the values were made, so
they also hold that the momentum's zero is the old step, bit for bit.
"""

from __future__ import annotations

import pytest

from fedfair.research.experiment import load_federation, simulate
from fedfair.research.flags import config_from_flags

FLAGS = ("--dataset", "adult", "--rounds", "30", "--seed", "3", "--epsilon", "0.1", "--rho", "0.3", "--server-momentum", "0")
PINNED = {
    "train_objective": 0.7383339876376024,
    "train_objective_smooth": 6.186587915284046,
    "c": 6.806448459625244,
}
PINNED_HELD_OUT_WORST_RISK = 0.7520630398785685


@pytest.mark.slow
def test_a_seeded_run_gives_the_pinned_final_objective() -> None:
    config = config_from_flags(FLAGS)
    final = simulate(config, load_federation(config), progress=False)["final"]
    for key, value in PINNED.items():
        assert final[key] == pytest.approx(value, rel=1e-12, abs=0.0), key
    assert final["test"]["worst_risk"] == pytest.approx(PINNED_HELD_OUT_WORST_RISK, rel=1e-12, abs=0.0)
