"""FedSRCVaR as a Flower strategy: the server step of `fedfair.core.algorithm` on the sum of the sites' updates.

Every connected site trains every round, as in `fedfair.api.federate`. Before round 1 the strategy asks each
site its n_k (a query message) and splits the total batch in proportion, b_k = `client_batch_sizes`, ordered
by partition id; with `batch_fraction` each site takes round(fraction * n_k) itself and no size is asked.
Each round it sums the sites' [b_k dtheta, b_k dc, b_k] (plain float64 sums, in partition order), moves to
the weighted mean, projects c onto [0, B] and folds the pair the round started from into the suffix average:
`FedSRCVaR.server_apply`, the very step fedfair's aggregator takes. The arrays Flower carries between rounds
(and `Result.arrays`) are the last iterate; `output` is the algorithm's output, the suffix average.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from torch import nn

from fedfair.core import server
from fedfair.core.algorithm import FedSRCVaR
from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.data import client_batch_sizes
from fedfair.core.errors import AggregateError, ConfigError
from fedfair.core.models import flat_parameters, load_flat_parameters, seeded, trainable_module
from fedfair.flower.settings import (
    ARRAYS,
    BATCH_FRACTION,
    BATCH_SIZE,
    CONFIG,
    EXAMPLES,
    METRICS,
    PARTITION,
    SERVER_ROUND,
    UPDATE,
    FlowerSettings,
    pair_record,
    read_pair,
    whole,
)
from fedfair.simulation.federation import ModelFactory
from fedfair.simulation.rounds import SimulationOptions

logger = logging.getLogger(__name__)


def initial_arrays(
    model_factory: ModelFactory,
    *,
    seed: int = TrainingConfig.seed,
    dtype: str = SimulationOptions.dtype,
    bound: float = ObjectiveConfig.bound,
) -> ArrayRecord:
    """The pair a federation starts from: theta_0 and c^1 = B.

    theta_0 is the factory's model built under `seed`, in `dtype`, as every fedfair party builds it.

    Raises:
        ConfigError: for a dtype other than float32 or float64.
    """
    torch_dtype = SimulationOptions(dtype=dtype).torch_dtype
    model = trainable_module(seeded(model_factory, seed), "the model factory").to(torch_dtype)
    return pair_record(flat_parameters(model), bound)


def output_model(model_factory: ModelFactory, theta: torch.Tensor) -> nn.Module:
    """The factory's model holding the flat `theta` (`FedSRCVaRStrategy.output`'s average), in eval mode."""
    model = trainable_module(model_factory(), "the model factory")
    parameter = next(model.parameters())
    load_flat_parameters(model, theta.to(parameter.device, parameter.dtype))
    return model.eval()


class FedSRCVaRStrategy(Strategy):
    """FedSRCVaR (Algorithm 1) on Flower's server API, with `fedfair.api.federate`'s settings and defaults.

    Each default is read where `federate` reads it (`ObjectiveConfig`, `LocalConfig`, `TrainingConfig`,
    `SimulationOptions`), so the two cannot drift apart (tests/flower/test_settings.py holds them equal).

    `batch_size` is the total mini-batch per round, split b_k proportional to n_k (0: full local batches);
    `batch_fraction`, when given, replaces it by b_k = round(fraction * n_k) taken at each site. The
    output averages the pairs rounds int(average_from * num_rounds) + 1 .. num_rounds start from.
    `min_nodes` sites must be connected before a round starts. After `start`, `state` is the server's
    `fedfair.core.server.ServerState` (the last iterate and the average) and `output()` the averaged pair.
    """

    def __init__(
        self,
        *,
        rho: float,
        epsilon: float,
        local_steps: int = LocalConfig.local_steps,
        lr: float = LocalConfig.lr,
        threshold_lr: float = LocalConfig.threshold_lr,
        batch_size: int = TrainingConfig.batch_size,
        batch_fraction: float | None = None,
        gamma: float = ObjectiveConfig.gamma,
        smooth: str = ObjectiveConfig.smooth,
        bound: float = ObjectiveConfig.bound,
        seed: int = TrainingConfig.seed,
        dtype: str = SimulationOptions.dtype,
        average_from: float = TrainingConfig.average_from,
        min_nodes: int = 2,
    ) -> None:
        objective = ObjectiveConfig(epsilon=epsilon, rho=rho, gamma=gamma, smooth=smooth, bound=bound)
        local = LocalConfig(local_steps=local_steps, lr=lr, threshold_lr=threshold_lr)
        self.settings = FlowerSettings(objective, local, seed=seed, dtype=dtype)
        # Checked as fedfair checks a schedule (one round stands in until `start` says how many).
        TrainingConfig(rounds=1, local=local, batch_size=batch_size, batch_fraction=batch_fraction, average_from=0.0)
        if average_from != TrainingConfig.average_from:
            TrainingConfig(rounds=1, average_from=average_from)
        if min_nodes < 1:
            raise ConfigError(f"min_nodes must be at least 1, got {min_nodes}")
        self.batch_size = batch_size
        self.batch_fraction = batch_fraction
        self.average_from = average_from
        self.min_nodes = min_nodes
        self.algorithm = FedSRCVaR(local, bound=bound)
        self.state: server.ServerState | None = None
        self._average_from_round = 0
        self._batch_sizes: dict[int, int] = {}
        self._timeout: float | None = None

    def summary(self) -> None:
        """Log the federation's settings."""
        batch = f"fraction {self.batch_fraction}" if self.batch_fraction is not None else f"total {self.batch_size}"
        logger.info("FedSRCVaR: %s; batch %s; average from %s", self.settings, batch, self.average_from)

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's round loop from `initial_arrays` (`fedfair.flower.initial_arrays`), the server state set first."""
        self.begin(initial_arrays, num_rounds, timeout)
        return super().start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn)

    def begin(self, initial_arrays: ArrayRecord, num_rounds: int, timeout: float | None) -> None:
        """Set the server state to `initial_arrays`' pair and the schedule to `num_rounds` (what `start` does first).

        Raises:
            ConfigError: for a schedule fedfair refuses, or arrays that are not a FedSRCVaR pair.
        """
        schedule = TrainingConfig(rounds=num_rounds, average_from=self.average_from)
        self._average_from_round = schedule.average_from_round
        theta, c = read_pair(initial_arrays)
        self.state = self.algorithm.server_init(theta, c)
        self._batch_sizes = {}
        self._timeout = timeout

    def output(self) -> tuple[torch.Tensor, float]:
        """The algorithm's output: the suffix-averaged (theta, c), theta flat in float64."""
        state = self._server_state()
        return state.theta_average, state.c_average

    def _server_state(self) -> server.ServerState:
        if self.state is None:
            raise RuntimeError("the strategy has not started; call start(grid, initial_arrays, num_rounds)")
        return self.state

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One train message per connected site: the pair, the settings, the round and the site's b_k."""
        _, connected = sample_nodes(grid, self.min_nodes, self.min_nodes)  # waits for min_nodes to connect
        configs = self.site_configs(server_round, sorted(connected), grid)
        return [
            Message(
                RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord({**dict(config.items()), **site_config})}),
                dst_node_id=node,
                message_type=MessageType.TRAIN,
            )
            for node, site_config in configs.items()
        ]

    def site_configs(self, server_round: int, nodes: list[int], grid: Grid) -> dict[int, dict[str, int | float | str]]:
        """Each node's train config: the settings, the round and its b_k (asked of the sites once)."""
        shared = {**self.settings.to_config(), SERVER_ROUND: server_round}
        if self.batch_fraction is not None:
            return {node: {**shared, BATCH_FRACTION: self.batch_fraction} for node in nodes}
        if set(nodes) - set(self._batch_sizes):
            self._batch_sizes = self._split_batch(nodes, grid)
        return {node: {**shared, BATCH_SIZE: self._batch_sizes[node]} for node in nodes}

    def _split_batch(self, nodes: list[int], grid: Grid) -> dict[int, int]:
        """b_k for each node: the total split in proportion to the sizes the sites report, in partition order."""
        query = [
            Message(RecordDict({CONFIG: ConfigRecord()}), dst_node_id=node, message_type=MessageType.QUERY)
            for node in nodes
        ]
        sizes: dict[int, tuple[int, int]] = {}
        for reply in grid.send_and_receive(query, timeout=self._timeout):
            if reply.has_error():
                raise AggregateError(
                    f"site {reply.metadata.src_node_id} did not report its size ({reply.error.reason}); "
                    "check that its ClientApp is fedfair.flower.client_app"
                )
            metrics = reply.content.metric_records[METRICS]
            sizes[reply.metadata.src_node_id] = (
                whole(metrics[PARTITION], f"site {reply.metadata.src_node_id}'s {PARTITION}"),
                whole(metrics[EXAMPLES], f"site {reply.metadata.src_node_id}'s size"),
            )
        if set(sizes) != set(nodes):
            raise AggregateError(f"{len(sizes)} of {len(nodes)} sites reported their sizes; the round cannot split")
        ordered = sorted(nodes, key=lambda node: sizes[node][0])
        partitions = [sizes[node][0] for node in ordered]
        if len(set(partitions)) != len(partitions):
            raise ConfigError(
                f"two sites share a partition id ({partitions}); give each SuperNode its own partition-id"
            )
        shares = client_batch_sizes([sizes[node][1] for node in ordered], self.batch_size)
        return dict(zip(ordered, shares, strict=True))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The server step on the sum of the replies' weighted updates; the new last iterate and its metrics.

        A reply that carries an error is left out, as a site that dropped out of the round; with no reply
        the round is void and the pair stays where it was.
        """
        valid: list[Message] = []
        for reply in replies:
            if reply.has_error():
                logger.warning(
                    "site %d left round %d: %s", reply.metadata.src_node_id, server_round, reply.error.reason
                )
            else:
                valid.append(reply)
        if not valid:
            logger.warning("round %d: no site replied; the round is void and the pair unchanged", server_round)
            return None, None
        valid.sort(key=lambda reply: whole(reply.content.metric_records[METRICS][PARTITION], PARTITION))
        vectors = [np.asarray(reply.content.array_records[ARRAYS][UPDATE].numpy(), np.float64) for reply in valid]
        if len({vector.shape for vector in vectors}) != 1:
            raise AggregateError(
                f"the sites sent updates of sizes {sorted({vector.size for vector in vectors})}; every site must "
                "train the same model"
            )
        summed = torch.from_numpy(np.stack(vectors)).sum(dim=0)
        metrics = self.step(summed[:-1], float(summed[-1]), len(valid))
        state = self._server_state()
        return pair_record(state.theta, state.c), MetricRecord({**metrics})

    def step(self, weighted_delta: torch.Tensor, total_weight: float, sites: int) -> dict[str, float]:
        """The server step on a round's sums [sum b_k dtheta, sum b_k dc] and sum b_k; the round's metrics.

        Raises:
            AggregateError: for a void sum (no weight, NaN or Inf), leaving the pair where it was.
        """
        aggregate = server.Aggregate.from_vector(weighted_delta, total_weight)
        self.state = self.algorithm.server_apply(self._server_state(), aggregate, average_from=self._average_from_round)
        return {"c": self.state.c, "c-average": self.state.c_average, "total-weight": total_weight, "sites": sites}

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No federated evaluation: the worst-group report is fedfair's own (docs/flower.md); use `evaluate_fn`."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Nothing to aggregate (`configure_evaluate` sends nothing)."""
        return None
