"""FedSRCVaR under Flower's SecAgg+: the sites' updates masked and summed by Flower's own secure aggregation.

Flower 1.42 runs SecAgg+ as `SecAggPlusWorkflow`, a workflow of its older fit-based `Strategy` (`configure_fit`,
`aggregate_fit`) driven by `DefaultWorkflow` inside a ServerApp's main; the message-based `Strategy` that
`FedSRCVaRStrategy` implements has no such hook. So `train_with_secaggplus` runs the same strategy through
an adapter of that older interface: each round the workflow sends the pair and each site's settings (the
strategy's own `site_configs`), the site's `secaggplus_mod` scales its reply (dtheta, dc) by its weight
b_k / max_weight, clips each entry to [-clipping_range, clipping_range], quantises it stochastically to
quantization_range levels and masks it; the server recovers only the weighted mean, on which the adapter
takes the strategy's own server step. What that costs in exactness: docs/flower.md, "Under SecAgg+".
"""

from __future__ import annotations

import logging

import torch
from flwr.app import ArrayRecord, Context
from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, Parameters, Scalar
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy as FitStrategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid

from fedfair.core.errors import AggregateError
from fedfair.flower.settings import pair_parameters, read_pair, vector_of
from fedfair.flower.strategy import FedSRCVaRStrategy

logger = logging.getLogger(__name__)


class FitAdapter(FitStrategy):
    """`FedSRCVaRStrategy` as Flower's fit-based `Strategy`, the interface `SecAggPlusWorkflow` drives.

    It configures each round with the strategy's own `site_configs` and takes the strategy's own server
    step on the weighted mean SecAgg+ reveals; it has no federated evaluation, as the strategy has none.
    """

    def __init__(self, strategy: FedSRCVaRStrategy, grid: Grid, initial: Parameters, timeout: float) -> None:
        self.strategy = strategy
        self.grid = grid
        self.initial = initial
        self.timeout = timeout

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """The pair the federation starts from."""
        return self.initial

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Every connected site (once `min_nodes` are), with the pair and its settings and b_k."""
        if not client_manager.wait_for(self.strategy.min_nodes, timeout=round(self.timeout)):
            raise AggregateError(
                f"fewer than {self.strategy.min_nodes} sites connected within {self.timeout:.0f} s; start their "
                "SuperNodes, or lower the strategy's min_nodes"
            )
        proxies = {proxy.node_id: proxy for proxy in client_manager.all().values()}
        configs = self.strategy.site_configs(server_round, sorted(proxies), self.grid)
        return [(proxies[node], FitIns(parameters, {**config})) for node, config in configs.items()]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """The server step on SecAgg+'s weighted mean (every result carries the same unmasked mean).

        The sums the step takes are the mean times sum b_k, the weights the sites reported; a site that
        failed is left out of the sum by SecAgg+ itself, and with no result the pair stays where it was.
        """
        for failure in failures:
            logger.warning("a site left round %d: %s", server_round, failure)
        if not results:
            logger.warning("round %d: no site replied; the round is void and the pair unchanged", server_round)
            return None, {}
        mean = torch.from_numpy(vector_of(results[0][1].parameters))
        total_weight = float(sum(result.num_examples for _, result in results))
        metrics = self.strategy.step(mean * total_weight, total_weight, len(results))
        state = self.strategy.state
        assert state is not None  # step set it
        return pair_parameters(state.theta, state.c), {**metrics}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """No federated evaluation (the strategy has none)."""
        return []

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        """Nothing to aggregate."""
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        """No central evaluation."""
        return None


def train_with_secaggplus(
    strategy: FedSRCVaRStrategy,
    grid: Grid,
    context: Context,
    initial_arrays: ArrayRecord,
    num_rounds: int,
    workflow: SecAggPlusWorkflow,
    *,
    timeout: float = 3600,
) -> None:
    """`strategy.start`'s rounds with every site's update masked by Flower's SecAgg+ `workflow`.

    Run it in a ServerApp's main; the sites run `client_app(..., secaggplus=True)`. Afterwards
    `strategy.state` and `strategy.output()` are what `start` leaves. The workflow's `max_weight` must be at
    least the largest b_k, and its `clipping_range` at least b_k / max_weight times the largest entry of a
    site's (dtheta, dc): a site refuses a round that would be clipped.
    """
    strategy.begin(initial_arrays, num_rounds, timeout)
    theta, c = read_pair(initial_arrays)
    legacy = LegacyContext(
        context, ServerConfig(num_rounds=num_rounds), FitAdapter(strategy, grid, pair_parameters(theta, c), timeout)
    )
    DefaultWorkflow(fit_workflow=workflow)(grid, legacy)
