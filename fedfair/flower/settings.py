"""What the strategy tells every client app each round, and the records a round's pair and update travel in.

The server holds the federation's settings and sends them in each train message's config, so no site can
train a different objective than the one aggregated; each site adds only its data. The pair (theta, c)
travels as two float64 arrays, and a site's contribution as one float64 vector, [b_k dtheta, b_k dc, b_k],
whose plain sum over sites is all the server step needs (what Flower's SecAgg+ would sum masked).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from flwr.common import Parameters, ndarrays_to_parameters, parameters_to_ndarrays

from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.errors import ConfigError
from fedfair.simulation.rounds import SimulationOptions

ARRAYS = "arrays"
"""The train message's record of the global pair, and the reply's record of the weighted update."""
CONFIG = "config"
"""The train message's config record: the settings, the round, the site's batch size."""
METRICS = "metrics"
"""The reply's metric record."""
THETA, THRESHOLD, UPDATE = "theta", "c", "weighted-update"
SERVER_ROUND = "server-round"
"""Flower's own key for the round number (its strategies set it too)."""
BATCH_SIZE = "fedfair.batch-size"
"""b_k, this site's mini-batch: the strategy's share of the total, or the site's own from the fraction."""
BATCH_FRACTION = "fedfair.batch-fraction"
PARTITION = "partition-id"
"""The node config key naming a site's place in the federation (Flower's simulation sets it; a SuperNode
takes it from --node-config), which seeds its sampler as fedfair's collaborator index does."""
EXAMPLES = "num-examples"
"""n_k in the size query's reply; b_k in a train reply (Flower's key for a reply's weight)."""


@dataclass(frozen=True)
class FlowerSettings:
    """The federation's settings as `fedfair.api.federate` takes them: the objective, local steps, seed, dtype."""

    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    seed: int = TrainingConfig.seed
    dtype: str = SimulationOptions.dtype

    def __post_init__(self) -> None:
        SimulationOptions(dtype=self.dtype)  # refuses a dtype the simulation does not train in, naming the two
        if self.local != LocalConfig(self.local.local_steps, self.local.lr, self.local.threshold_lr):
            raise ConfigError(
                "the Flower client app takes local_steps, lr and threshold_lr only; reuse_batch, project_locally "
                "and drift correction run in fedfair's own runtime (fedfair.api, fedfair launch)"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype the model and data train in."""
        return SimulationOptions(dtype=self.dtype).torch_dtype

    def to_config(self) -> dict[str, int | float | str]:
        """The settings as config record entries (prefixed ``fedfair.``, beside the caller's own)."""
        objective, local = self.objective, self.local
        return {
            "fedfair.epsilon": objective.epsilon,
            "fedfair.rho": objective.rho,
            "fedfair.gamma": objective.gamma,
            "fedfair.smooth": objective.smooth,
            "fedfair.bound": objective.bound,
            "fedfair.local-steps": local.local_steps,
            "fedfair.lr": local.lr,
            "fedfair.threshold-lr": local.threshold_lr,
            "fedfair.seed": self.seed,
            "fedfair.dtype": self.dtype,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> FlowerSettings:
        """The settings a train message carries.

        Raises:
            ConfigError: when an entry is missing (the message did not come from `FedSRCVaRStrategy`).
        """
        try:
            objective = ObjectiveConfig(
                epsilon=_number(config["fedfair.epsilon"]),
                rho=_number(config["fedfair.rho"]),
                gamma=_number(config["fedfair.gamma"]),
                smooth=str(config["fedfair.smooth"]),
                bound=_number(config["fedfair.bound"]),
            )
            local = LocalConfig(
                local_steps=whole(config["fedfair.local-steps"], "the local steps"),
                lr=_number(config["fedfair.lr"]),
                threshold_lr=_number(config["fedfair.threshold-lr"]),
            )
            return cls(
                objective, local, seed=whole(config["fedfair.seed"], "the seed"), dtype=str(config["fedfair.dtype"])
            )
        except KeyError as missing:
            raise ConfigError(
                f"the train message has no {missing} setting; this client app trains with the settings "
                "fedfair.flower.FedSRCVaRStrategy sends, so run that strategy on the server"
            ) from None


def _number(value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(f"a fedfair setting in the train message is {value!r}, not a number")
    return float(value)


def whole(value: object, what: str) -> int:
    """`value` as an int, once it is a whole number (records carry ints, and floats where a sender widened them).

    Raises:
        ConfigError: naming `what`, for anything else.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ConfigError(f"{what} is {value!r}, not a whole number")
    return int(value)


def pair_record(theta: torch.Tensor, c: float) -> ArrayRecord:
    """The global pair (theta, c) as an array record: theta flat, both float64."""
    flat = theta.detach().to("cpu", torch.float64).reshape(-1).numpy()
    return ArrayRecord(array_dict={THETA: Array(flat), THRESHOLD: Array(np.array([c], dtype=np.float64))})


def read_pair(record: ArrayRecord) -> tuple[torch.Tensor, float]:
    """(theta, c) from `pair_record`'s record.

    Raises:
        ConfigError: when the record is not a FedSRCVaR pair (a model's own state dict, say).
    """
    if THETA not in record or THRESHOLD not in record:
        raise ConfigError(
            f"the arrays hold {sorted(record)}, not FedSRCVaR's pair ('{THETA}', '{THRESHOLD}'); "
            "start the strategy from fedfair.flower.initial_arrays(model_factory)"
        )
    theta = torch.from_numpy(np.array(record[THETA].numpy(), dtype=np.float64).reshape(-1))
    return theta, float(record[THRESHOLD].numpy().reshape(-1)[0])


def pair_parameters(theta: torch.Tensor, c: float) -> Parameters:
    """The pair as the fit interface carries it: one float64 vector [theta, c]."""
    flat = theta.detach().to("cpu", torch.float64).reshape(-1)
    return ndarrays_to_parameters([torch.cat([flat, torch.tensor([c], dtype=torch.float64)]).numpy()])


def vector_of(parameters: Parameters) -> np.ndarray:
    """The one float64 vector `parameters` holds ([theta, c], or a round's [dtheta, dc]).

    Raises:
        ConfigError: when it holds anything else (a model's own arrays, say).
    """
    arrays = parameters_to_ndarrays(parameters)
    if len(arrays) != 1 or arrays[0].ndim != 1:
        raise ConfigError(
            f"the parameters hold {len(arrays)} arrays, not FedSRCVaR's one vector; train through "
            "fedfair.flower.secaggplus.train_with_secaggplus on the server and client_app(..., secaggplus=True)"
        )
    return np.asarray(arrays[0], dtype=np.float64)
