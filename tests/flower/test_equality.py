"""FedSRCVaR through Flower's simulation engine equals `fedfair.api.federate`: same seeds, split, batches.

Runs in `make test-flower`'s own environment (Flower pins protobuf < 7); the main suite skips it.
"""

from __future__ import annotations

import pytest

flwr = pytest.importorskip("flwr")

import torch  # noqa: E402
from flwr.app import Context  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402
from torch import nn  # noqa: E402

from fedfair.api import federate  # noqa: E402
from fedfair.core.data import client_batch_sizes  # noqa: E402
from fedfair.flower import FedSRCVaRStrategy, client_app, initial_arrays  # noqa: E402
from fedfair.flower.client import partition_of  # noqa: E402
from tests.federations import adult_by_race  # noqa: E402

pytestmark = pytest.mark.slow

ROUNDS = 12
"""Two passes over each site's rows (b_k = 188, 75, 37 of 3000, 1200, 600, three a round), so the ClientApp's
replayed sampler reshuffles, and five rounds after c reaches the losses (round 7), where the CVaR term moves theta."""
SETTINGS = dict(rho=0.2, epsilon=0.1, local_steps=3, lr=0.2, threshold_lr=0.5, batch_size=300, seed=7)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(107, 16), nn.ReLU(), nn.Linear(16, 2))


def relative(flower: torch.Tensor, fedfair: torch.Tensor) -> float:
    return float((flower - fedfair).norm() / fedfair.norm())


def test_flower_simulation_gives_federates_final_pair_to_1e_6_relative() -> None:
    federation = adult_by_race(caps=[3000, 1200, 600])
    sites = [(part.features, part.labels) for part in federation.train]
    sizes = [part.size for part in federation.train]
    drawn = ROUNDS * int(SETTINGS["local_steps"])
    batches = client_batch_sizes(sizes, int(SETTINGS["batch_size"]))
    assert all(drawn * batch > 2 * size for batch, size in zip(batches, sizes, strict=True))
    reference = federate(mlp, sites, rounds=ROUNDS, **SETTINGS)  # type: ignore[arg-type]

    strategy = FedSRCVaRStrategy(min_nodes=3, **SETTINGS)  # type: ignore[arg-type]
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy.start(grid, initial_arrays(mlp, seed=SETTINGS["seed"]), num_rounds=ROUNDS)

    clients = client_app(mlp, lambda context: sites[partition_of(context)])
    run_simulation(server, clients, num_supernodes=3, backend_config={"client_resources": {"num_cpus": 1}})

    state, expected = strategy.state, reference.state
    assert state is not None and state.round == ROUNDS
    # Both sides ran the same float32 steps and float64 sums: agreement is to rounding, far inside 1e-6.
    assert relative(state.theta, expected.theta) <= 1e-6
    assert relative(state.theta_average, expected.theta_average) <= 1e-6
    assert state.c == pytest.approx(expected.c, rel=1e-6, abs=1e-9)
    assert state.c_average == pytest.approx(expected.c_average, rel=1e-6, abs=1e-9)
    # Training moved the pair: equality of two unmoved starts would prove nothing.
    start = initial_arrays(mlp, seed=SETTINGS["seed"])["theta"].numpy()
    assert relative(state.theta, torch.from_numpy(start).double()) > 1e-2
    assert state.c != SETTINGS.get("bound", 10.0)
