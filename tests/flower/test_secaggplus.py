"""FedSRCVaR under Flower's SecAgg+ in Flower's simulation engine: the masked round's pair, and what a site refuses."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE  # noqa: E402
from flwr.server.workflow import SecAggPlusWorkflow  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402
from torch import nn  # noqa: E402

from fedfair.core.data import client_batch_sizes  # noqa: E402
from fedfair.core.errors import ConfigError  # noqa: E402
from fedfair.flower import FedSRCVaRStrategy, client_app, initial_arrays  # noqa: E402
from fedfair.flower.client import check_unclipped, partition_of  # noqa: E402
from fedfair.flower.secaggplus import train_with_secaggplus  # noqa: E402
from fedfair.flower.settings import read_pair  # noqa: E402
from tests.federations import adult_by_race  # noqa: E402
from tests.flower.quantisation import first_round_under_secaggplus  # noqa: E402

SETTINGS = dict(rho=0.2, epsilon=0.1, local_steps=3, lr=0.2, threshold_lr=0.5, batch_size=300, seed=7)
MAX_WEIGHT = 300.0
"""The total batch: no site's b_k exceeds it, so the mod scales no update up."""


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(107, 16), nn.ReLU(), nn.Linear(16, 2))


@pytest.mark.slow
def test_a_masked_round_moves_the_pair_to_the_weighted_mean_within_the_quantisation_bound() -> None:
    federation = adult_by_race(caps=[3000, 1200, 600])
    sites = [(part.features, part.labels) for part in federation.train]
    strategy = FedSRCVaRStrategy(min_nodes=3, **SETTINGS)  # type: ignore[arg-type]
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        workflow = SecAggPlusWorkflow(num_shares=3, reconstruction_threshold=2, max_weight=MAX_WEIGHT)
        train_with_secaggplus(strategy, grid, context, initial_arrays(mlp, seed=7), 1, workflow)

    # A site that insists on SecAgg+ trains: the server masked its round.
    clients = client_app(mlp, lambda context: sites[partition_of(context)], require_secaggplus=True)
    run_simulation(server, clients, num_supernodes=3, backend_config={"client_resources": {"num_cpus": 1}})

    state = strategy.state
    assert state is not None and state.round == 1
    shares = client_batch_sizes([len(labels) for _, labels in sites], 300)
    start = read_pair(initial_arrays(mlp, seed=7))
    exact, bound, move = first_round_under_secaggplus(mlp, sites, strategy.settings, shares, MAX_WEIGHT, start)
    secured = np.concatenate([state.theta.numpy(), [state.c]])
    error = np.abs(secured - exact).max()
    assert error <= bound, f"SecAgg+ moved the pair {error:.3g} from the weighted mean, beyond its bound {bound:.3g}"
    # The pair came through SecAgg+'s quantisation (not a plain sum), and the round moved it far beyond the bound.
    assert error > 0.0
    assert move > 100 * bound


def secaggplus_context(clipping_range: float, max_weight: float) -> Context:
    state = RecordDict({RECORD_KEY_STATE: ConfigRecord({"clipping_range": clipping_range, "max_weight": max_weight})})
    return Context(run_id=1, node_id=7, node_config={}, state=state, run_config={})


def test_a_site_refuses_an_update_secaggplus_would_clip_or_overweight() -> None:
    delta = np.array([0.5, -2.0, 0.1])
    check_unclipped(delta, 100.0, secaggplus_context(clipping_range=8.0, max_weight=100.0))  # 2.0 <= 8: sent
    with pytest.raises(ConfigError, match="would clip .* raise SecAggPlusWorkflow's clipping_range"):
        check_unclipped(delta, 100.0, secaggplus_context(clipping_range=1.5, max_weight=100.0))
    with pytest.raises(ConfigError, match="exceeds SecAggPlusWorkflow's max_weight 50"):
        check_unclipped(delta, 100.0, secaggplus_context(clipping_range=8.0, max_weight=50.0))
