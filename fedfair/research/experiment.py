"""One experiment in process: a dataset cut into collaborators, a method run on it, a fairness report.

Every method is judged by the same report on held-out data, so FedSRCVaR and the
baselines compare like for like. The command line (`fedfair simulate`, `fedfair
reference`) is `fedfair.research.flags`; the grid of experiments, `fedfair sweep`, is
`fedfair.research.sweep`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedfair.core.config import ObjectiveConfig, TrainingConfig
from fedfair.core.errors import ConfigError
from fedfair.core.evaluation import evaluate
from fedfair.core.models import build_model
from fedfair.core.objective import cvar_threshold
from fedfair.core.server import ServerState
from fedfair.datasets import ClientSplit, Dataset, load_csv, load_dataset, partition
from fedfair.fairness import pooled
from fedfair.fairness.references import uniform_risk
from fedfair.privacy.config import PrivacyConfig
from fedfair.research import minimax
from fedfair.research.baselines import FedAvgSettings
from fedfair.research.methods import METHODS, MethodSettings, method_named, own
from fedfair.research.minimax import FedMinMaxSettings
from fedfair.research.task import NoSettings, Task
from fedfair.runtime.observe.progress import Progress
from fedfair.research.reference import solve_reference
from fedfair.simulation.federation import Federation, federation_from_arrays
from fedfair.simulation.rounds import SimulationOptions, SimulationResult, training_objectives


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything one simulated experiment needs; `to_dict` is what --json records."""

    dataset: str = "adult"
    data: str | None = None
    label: str | None = None
    split_by: str | None = None
    features: tuple[str, ...] | None = None
    partition: str = "race"
    clients: int = 3
    alpha: float = 0.5
    method: str = "fedsrcvar"
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    simulation: SimulationOptions = field(default_factory=SimulationOptions)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    secure_aggregation: bool = False
    settings: MethodSettings = field(default_factory=NoSettings)
    """The method's own settings (`fedfair.research.methods`), of the kind its method takes."""
    colluders: int | None = None
    """Under distributed DP (`privacy.mode`), the sites that may collude with the aggregator, whose share of the
    noise the others carry (`--dp-colluders`); None otherwise."""

    def __post_init__(self) -> None:
        method = method_named(self.method)
        if not isinstance(self.settings, method.settings):
            raise ConfigError(
                f"--method {self.method} takes {method.settings.__name__}, not {type(self.settings).__name__}; "
                "build the settings with methods.settings_for"
            )
        if self.features is not None and self.data is None:
            raise ConfigError("--features picks columns of your own table; pass it with --data FILE --label COLUMN")
        if self.clients < 1:
            raise ConfigError(f"clients must be at least 1, got {self.clients}; e.g. --clients 3")
        self._check_distributed()
        distributed = self.privacy.enabled and self.privacy.mode == "distributed"
        if self.privacy.enabled and not (method.private or (distributed and method.distributed)):
            private = ", ".join(name for name, each in METHODS.items() if each.private)
            raise ConfigError(f"DP-SGD is available for {private}, not {self.method}; drop the --dp-* flags")
        if self.secure_aggregation and (not method.distributed or self.clients < 2):
            secure = " or ".join(name for name, each in METHODS.items() if each.distributed)
            raise ConfigError(f"--secure-aggregation needs --method {secure} and at least 2 clients")
        if self.secure_aggregation and method.secure_only_private and not distributed:
            raise ConfigError(
                f"--method {self.method} sums securely only under its DP mechanism; add --dp-mode distributed "
                "(with --dp-target-epsilon) or drop --secure-aggregation"
            )
        local_epochs = isinstance(self.settings, FedAvgSettings) and self.settings.local_epochs is not None
        if self.training.local.corrects_drift and (not method.corrects_drift or local_epochs):
            raise ConfigError(
                f"--drift-correction applies to fedsrcvar and fedavg with --local-steps, not --method {self.method}"
                f"{' with --local-epochs' if local_epochs else ''}; drop --drift-correction"
            )

    def _check_distributed(self) -> None:
        """Refuse what distributed DP cannot train: another method, several local steps, a bad collusion bound."""
        distributed = self.privacy.enabled and self.privacy.mode == "distributed"
        if not distributed:
            if self.colluders is not None:
                raise ConfigError("--dp-colluders applies under --dp-mode distributed only; drop it")
            return
        if not method_named(self.method).distributed:
            secure = " or ".join(name for name, each in METHODS.items() if each.distributed)
            raise ConfigError(
                f"--dp-mode distributed noises the secure sum of {secure}, not --method {self.method}; use "
                f"--method {secure}, or --dp-mode local for DP-SGD on every collaborator"
            )
        local = self.training.local
        if local.local_steps != 1 or local.corrects_drift:
            raise ConfigError(
                "--dp-mode distributed sums one clipped step a round inside the secure sum; "
                "pass --local-steps 1 and drop --drift-correction"
            )
        if self.colluders is None or not 0 <= self.colluders <= self.clients - 2:
            raise ConfigError(
                f"--dp-colluders must leave two honest sites of the {self.clients}: a number from 0 to "
                f"{max(self.clients - 2, 0)}, got {self.colluders}"
            )

    def to_dict(self) -> dict[str, Any]:
        """Every field, nested configs included, as plain dicts (for the run's JSON)."""
        return asdict(self)


def _dataset_and_splits(config: ExperimentConfig) -> tuple[Dataset, list[ClientSplit]]:
    if config.data is not None:
        dataset = load_csv(
            Path(config.data),
            label=config.label or "",
            split_by=config.split_by,
            features=list(config.features) if config.features is not None else None,
            seed=config.training.seed,
        )
    else:
        dataset = load_dataset(config.dataset)
    return dataset, partition(dataset, config.partition, config.clients, seed=config.training.seed, alpha=config.alpha)


def held_out_columns(config: ExperimentConfig, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """Each named group column's value for every held-out row, and the row's class name under "label".

    Rows are in the order of the federation's pooled test rows (client by client), so they line up with
    the losses of `held_out_losses`.

    Raises:
        ConfigError: a column the dataset has no group column of.
    """
    dataset, splits = _dataset_and_splits(config)
    unknown = [column for column in columns if column not in dataset.attributes_test]
    if unknown:
        known = ", ".join(dataset.attributes_test) or "none"
        raise ConfigError(f"{dataset.name} has no group column {unknown[0]!r} (its columns: {known})")
    names = np.array(dataset.class_names)
    held: dict[str, np.ndarray] = {
        column: np.concatenate([dataset.attributes_test[column][split.test_index] for split in splits])
        for column in columns
    }
    held["label"] = np.concatenate([names[dataset.y_test[split.test_index]] for split in splits])
    return held


def load_federation(config: ExperimentConfig) -> Federation:
    """Load the dataset and split it into collaborators (train and held-out data alike).

    For FedMinMax the result is a `minimax.GroupedFederation`, which also carries
    every training sample's group in the sensitive column (its settings' `groups`, else
    the partition column); no other method is given it.
    """
    dataset, splits = _dataset_and_splits(config)
    federation = federation_from_arrays(
        [split.name for split in splits],
        [(dataset.x_train[split.train_index], dataset.y_train[split.train_index]) for split in splits],
        [(dataset.x_test[split.test_index], dataset.y_test[split.test_index]) for split in splits],
        dataset.num_classes,
        dataset.image_shape,
    )
    if config.method != "fedminmax":
        return federation
    column = own(config.settings, FedMinMaxSettings).groups or config.partition
    if column not in dataset.attributes_train:
        known = ", ".join(dataset.attributes_train) or "none"
        raise ConfigError(
            f"FedMinMax needs a sensitive column; '{column}' is not one of {dataset.name}'s (columns: {known}); "
            "pass --groups COLUMN"
        )
    names, group_of_row = np.unique(dataset.attributes_train[column], return_inverse=True)
    groups = [group_of_row[split.train_index] for split in splits]
    return minimax.with_groups(federation, groups, [str(name) for name in names])


@dataclass(frozen=True)
class Outcome:
    """A method's final parameters and threshold, with its per-round history."""

    theta: torch.Tensor
    c: float | None
    history: list[dict[str, float]]
    privacy: dict[str, dict[str, Any]]
    noise: dict[str, float | int] = field(default_factory=dict)
    """The secure sum's distributed DP noise (`SimulationResult.noise`); empty when it carries none."""


def _from_result(result: SimulationResult, has_threshold: bool) -> Outcome:
    state = result.state
    threshold = state.c_average if has_threshold else None
    return Outcome(state.theta_average, threshold, result.history, result.privacy, result.noise)


def run_method(
    config: ExperimentConfig, federation: Federation, on_round: Callable[[ServerState], None] | None = None
) -> Outcome:
    """Train with the configured method; the output is the averaged iterate as in the paper."""
    method = method_named(config.method)
    task = Task(
        federation,
        config.objective,
        config.training,
        config.privacy,
        options=config.simulation,
        secure_aggregation=config.secure_aggregation,
        on_round=on_round,
        colluders=config.colluders or 0,
    )
    return _from_result(method.run(task, config.settings), method.has_threshold)


def evaluation_model(config: ExperimentConfig, federation: Federation) -> torch.nn.Module:
    """A model of the run's architecture and dtype to load parameters into and evaluate (its weights are not used)."""
    return build_model(
        config.simulation.model,
        federation.num_features,
        federation.num_classes,
        image_shape=federation.image_shape,
        dtype=config.simulation.torch_dtype,
    )


def held_out_losses(
    config: ExperimentConfig, federation: Federation, theta: torch.Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample held-out losses and correctness of parameters `theta`, over the pooled test rows."""
    test = evaluate(evaluation_model(config, federation), theta, federation.pooled("test"))
    return np.asarray(test.losses), np.asarray(test.correct)


def final_report(
    config: ExperimentConfig, federation: Federation, theta: torch.Tensor, c: float | None
) -> dict[str, Any]:
    """Training objectives (exact and smoothed) and the held-out fairness report at rho.

    It includes the uniform classifier's risk ln K (`uniform_risk`) to read the risks against.
    """
    model = evaluation_model(config, federation)
    train = evaluate(model, theta, federation.pooled("train"))
    threshold = c if c is not None else cvar_threshold(train.losses, config.objective.rho)
    exact, smooth = training_objectives(train.losses, threshold, config.objective)
    report = pooled.group_risk_report(*held_out_losses(config, federation, theta), config.objective.rho)
    return {
        "train_objective": exact,
        "train_objective_smooth": smooth,
        "c": threshold,
        "test": report.to_dict(),
        "uniform_risk": uniform_risk(federation.num_classes),
    }


def simulate(config: ExperimentConfig, federation: Federation, progress: bool = True) -> dict[str, Any]:
    """Run one experiment and return the JSON-ready result; `progress` shows the rounds on stderr."""
    started = time.perf_counter()
    if progress:
        with Progress(config.training.rounds, config.method) as shown:
            outcome = run_method(config, federation, lambda state: shown.update(state.round, f"c={state.c:.4f}"))
    else:
        outcome = run_method(config, federation)
    result = {
        "config": config.to_dict(),
        "final": final_report(config, federation, outcome.theta, outcome.c),
        "history": outcome.history,
        "privacy": outcome.privacy,
        "seconds": time.perf_counter() - started,
        "clients": {client.name: client.size for client in federation.train},
    }
    # Only a run under distributed DP has the section, so every other run's JSON keeps its shape.
    return {**result, "distributed_noise": outcome.noise} if outcome.noise else result


def reference(config: ExperimentConfig, federation: Federation) -> dict[str, Any]:
    """The centralized optimum of the smoothed objective, in the same JSON shape as `simulate`."""
    started = time.perf_counter()
    solution = solve_reference(
        federation, config.objective, model_name=config.simulation.model, seed=config.training.seed
    )
    final = final_report(
        replace(config, simulation=replace(config.simulation, dtype="float64")), federation, solution.theta, solution.c
    )
    final["train_objective_smooth_solver"] = solution.objective_smooth
    return {
        "config": config.to_dict(),
        "final": final,
        "history": [{"iterations": solution.iterations}],
        "seconds": time.perf_counter() - started,
        "clients": {client.name: client.size for client in federation.train},
    }
