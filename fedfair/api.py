"""The Python API: federate your own PyTorch model over your own data in one call.

    from fedfair.api import federate
    result = federate(lambda: nn.Sequential(nn.Linear(107, 32), nn.ReLU(), nn.Linear(32, 2)),
                      [(x_a, y_a), (x_b, y_b), (x_c, y_c)], rho=0.2, epsilon=0.1, rounds=200)
    result.model(x_new)       # the trained model; result.threshold is the final c

It runs FedSRCVaR in process, with the very code a federation of processes runs
(fedfair.simulation.rounds), so a model trained here trains the same way across
institutions: set the plan's ``[model] factory`` to the same function. For the loss
alone, in a training loop of your own, use :class:`fedfair.RCVaRLoss`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.models import load_flat_parameters
from fedfair.core.server import ServerState
from fedfair.core.local import PerSampleLoss
from fedfair.simulation.federation import Batches, ModelFactory, federation_from_clients
from fedfair.simulation.rounds import SimulationOptions, run_fedsrcvar

__all__ = ["FederatedResult", "federate"]


@dataclass(frozen=True)
class FederatedResult:
    """What a federation trained.

    The model (the algorithm's averaged output, in eval mode), its threshold c, one record per recorded round,
    and the server's final state (the last iterate too).
    """

    model: nn.Module
    threshold: float
    history: list[dict[str, float]]
    state: ServerState


def federate(
    model_factory: ModelFactory,
    clients: Sequence[Batches],
    *,
    rho: float,
    epsilon: float,
    rounds: int,
    local_steps: int = LocalConfig.local_steps,
    lr: float = LocalConfig.lr,
    threshold_lr: float = LocalConfig.threshold_lr,
    batch_size: int = TrainingConfig.batch_size,
    loss: PerSampleLoss | None = None,
    gamma: float = ObjectiveConfig.gamma,
    smooth: str = ObjectiveConfig.smooth,
    bound: float = ObjectiveConfig.bound,
    seed: int = TrainingConfig.seed,
    device: str = SimulationOptions.device,
    dtype: str = SimulationOptions.dtype,
    average_from: float = TrainingConfig.average_from,
    record_every: int = 1,
) -> FederatedResult:
    """Train `model_factory`'s model with FedSRCVaR over `clients`, one entry per institution.

    Each client is a (features, labels) pair of tensors or an iterable of such batches
    (a DataLoader). The objective is (1 - epsilon) * CVaR_rho + epsilon * mean of the
    per-sample `loss` (cross-entropy by default; yours must return one loss per sample,
    i.e. reduction="none"). Each round every client takes `local_steps` SGD steps on a
    mini-batch, the `batch_size` rows of a round split across clients in proportion to
    their sizes (0: full batches). The factory is called under `seed`, so every client
    starts from the same model. `record_every` rounds (0: never) the history records
    the mean loss and the objective on the pooled training rows.

    Raises:
        ConfigError: naming the fix, for no clients, an objective or schedule out of range (e.g. rho or
            epsilon, a `batch_size` below the number of clients or above their rows), or a `loss` that
            does not return one loss per sample.
    """
    objective = ObjectiveConfig(epsilon=epsilon, rho=rho, gamma=gamma, smooth=smooth, bound=bound)
    training = TrainingConfig(
        rounds=rounds,
        batch_size=batch_size,
        local=LocalConfig(local_steps=local_steps, lr=lr, threshold_lr=threshold_lr),
        seed=seed,
        average_from=average_from,
    )
    options = SimulationOptions(device=device, dtype=dtype, record_every=record_every)
    federation = federation_from_clients(clients)
    result = run_fedsrcvar(federation, objective, training, options=options, model_factory=model_factory, loss=loss)
    model = result.model
    parameter = next(model.parameters())
    load_flat_parameters(model, result.state.theta_average.to(parameter.device, parameter.dtype))
    return FederatedResult(
        model=model.eval(), threshold=result.state.c_average, history=result.history, state=result.state
    )
