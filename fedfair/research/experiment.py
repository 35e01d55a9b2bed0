"""One experiment in process: a dataset cut into collaborators, a method run on it, a fairness report.

Every method is judged by the same report on held-out data, so FedSRCVaR and the
baselines compare like for like. The command line (`fedfair simulate`, `fedfair
reference`) is `fedfair.research.flags`; the grid of experiments, `fedfair sweep`, is
`fedfair.research.sweep`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedfair.core.config import ObjectiveConfig
from fedfair.core.errors import ConfigError
from fedfair.core.evaluation import evaluate
from fedfair.core.models import build_model
from fedfair.core.objective import cvar_threshold
from fedfair.core.server import Aggregate, ServerState
from fedfair.datasets import load_csv, load_dataset, partition
from fedfair.fairness import pooled
from fedfair.privacy.config import PrivacyConfig
from fedfair.research import baselines, dro, minimax
from fedfair.research.progress import Progress
from fedfair.research.reference import solve_reference
from fedfair.simulation.federation import Federation, federation_from_arrays
from fedfair.simulation.rounds import SimulationResult, TrainingConfig, run_fedsrcvar, training_objectives
from fedfair.simulation.secure import SecureSum
from fedfair.secagg import EncodingConfig, largest_safe_fractional_bits

METHODS = ("fedsrcvar", "fedavg", "afl", "qfedavg", "fedminmax", "central-erm", "central-cvar", "bpf", "dro")

LOSS_METHODS = ("afl", "qfedavg", "fedminmax")
"""Methods whose server needs losses at theta_t every round (`--loss-rows` bounds what they read)."""

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
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    secure_aggregation: bool = False
    afl_mixture_lr: float = 0.01
    qfedavg_q: float = 1.0
    local_epochs: int | None = None
    adversary_lr: float = 0.1
    groups: str | None = None
    loss_rows: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"unknown method '{self.method}'; choose one of: {', '.join(METHODS)}")
        if self.local_epochs is not None and self.method != "fedavg":
            raise ConfigError(f"--local-epochs sets FedAvg's local passes; drop it for --method {self.method}")
        baselines.LossRows.check(self.loss_rows)
        if self.loss_rows and self.method not in LOSS_METHODS:
            raise ConfigError(
                f"--loss-rows sets how many rows {', '.join(LOSS_METHODS)} read for their per-round losses; "
                f"drop it for --method {self.method}"
            )
        if self.groups is not None and self.method != "fedminmax":
            raise ConfigError(f"--groups names FedMinMax's sensitive column; drop it for --method {self.method}")
        if self.features is not None and self.data is None:
            raise ConfigError("--features picks columns of your own table; pass it with --data FILE --label COLUMN")
        if self.clients < 1:
            raise ConfigError(f"clients must be at least 1, got {self.clients}; e.g. --clients 3")
        if self.privacy.enabled and self.method not in ("fedsrcvar", "fedavg"):
            raise ConfigError(f"DP-SGD is available for fedsrcvar and fedavg, not {self.method}; drop the --dp-* flags")
        if self.secure_aggregation and (self.method != "fedsrcvar" or self.clients < 2):
            raise ConfigError("--secure-aggregation needs --method fedsrcvar and at least 2 clients")
        if self.training.local.corrects_drift and (
            self.method not in ("fedsrcvar", "fedavg") or self.local_epochs is not None
        ):
            raise ConfigError(
                f"--drift-correction applies to fedsrcvar and fedavg with --local-steps, not --method {self.method}"
                f"{' with --local-epochs' if self.local_epochs is not None else ''}; drop --drift-correction"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_federation(config: ExperimentConfig) -> Federation:
    """Load the dataset and split it into collaborators (train and held-out data alike).

    For FedMinMax the result is a `minimax.GroupedFederation`, which also carries
    every training sample's group in the sensitive column (`config.groups`, else
    the partition column); no other method is given it.
    """
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
    splits = partition(dataset, config.partition, config.clients, seed=config.training.seed, alpha=config.alpha)
    federation = federation_from_arrays(
        [split.name for split in splits],
        [(dataset.x_train[split.train_index], dataset.y_train[split.train_index]) for split in splits],
        [(dataset.x_test[split.test_index], dataset.y_test[split.test_index]) for split in splits],
        dataset.num_classes,
        dataset.image_shape,
    )
    if config.method != "fedminmax":
        return federation
    column = config.groups or config.partition
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


def _from_result(result: SimulationResult, has_threshold: bool) -> Outcome:
    state = result.state
    return Outcome(state.theta_average, state.c_average if has_threshold else None, result.history, result.privacy)


SECURE_CLIP = 10.0
SECURE_MODULUS_BITS = 64


def secure_sum(config: ExperimentConfig, federation: Federation) -> SecureSum:
    """Secure aggregation with the runtime's default encoding: deltas clipped to +-10, 64-bit
    words, as many fractional bits as the largest possible weighted sum leaves room for."""
    sizes = [client.size for client in federation.train]
    max_weight = float(max(sizes))
    bits = largest_safe_fractional_bits(SECURE_CLIP, SECURE_MODULUS_BITS, len(sizes), max_weight)
    return SecureSum(EncodingConfig(SECURE_CLIP, max_weight, bits, SECURE_MODULUS_BITS))


def run_method(
    config: ExperimentConfig, federation: Federation, on_round: Callable[[ServerState], None] | None = None
) -> Outcome:
    """Train with the configured method; the output is the averaged iterate as in the paper."""
    training, objective = config.training, config.objective
    if config.method == "fedsrcvar":
        aggregate = secure_sum(config, federation) if config.secure_aggregation else Aggregate.of
        result = run_fedsrcvar(
            federation, objective, training, aggregate=aggregate, on_round=on_round, privacy=config.privacy
        )
        return _from_result(result, True)
    if config.method == "fedavg":
        result = baselines.run_fedavg(
            federation, training, local_epochs=config.local_epochs, on_round=on_round, privacy=config.privacy
        )
    elif config.method == "afl":
        result = baselines.run_afl(
            federation, training, mixture_lr=config.afl_mixture_lr, loss_rows=config.loss_rows, on_round=on_round
        )
    elif config.method == "qfedavg":
        result = baselines.run_qfedavg(
            federation, training, q=config.qfedavg_q, loss_rows=config.loss_rows, on_round=on_round
        )
    elif config.method == "fedminmax":
        if not isinstance(federation, minimax.GroupedFederation):
            raise ConfigError(
                "FedMinMax needs every training sample's sensitive group: build the federation with "
                "load_federation(config) for --method fedminmax, or attach them with minimax.with_groups"
            )
        result = minimax.run_fedminmax(
            federation, training, adversary_lr=config.adversary_lr, loss_rows=config.loss_rows, on_round=on_round
        )
    elif config.method == "central-erm":
        result = baselines.run_central_erm(federation, training, on_round=on_round)
    elif config.method == "bpf":
        result = minimax.run_bpf(federation, objective, training, adversary_lr=config.adversary_lr, on_round=on_round)
    elif config.method == "dro":
        result = dro.run_dro(federation, objective, training, on_round=on_round)
    else:
        result = baselines.run_central_cvar(federation, objective, training, on_round=on_round)
        return _from_result(result, True)
    return _from_result(result, False)


def uniform_risk(num_classes: int) -> float:
    """ln K: the cross-entropy of the uniform classifier on K classes, whatever the data.

    The paper draws it as a reference line: at small rho a minimax-fair model can do
    no better on its worst group (BPF's critical group size; the paper's Remark on it).
    A binary model with one logit is uniform at logit 0, with the same ln 2.
    """
    if num_classes < 1:
        raise ConfigError(f"the uniform classifier needs at least one class, got {num_classes}")
    return math.log(max(num_classes, 2))


def final_report(config: ExperimentConfig, federation: Federation, theta: torch.Tensor, c: float | None) -> dict[str, Any]:
    """Training objectives (exact and smoothed), the held-out fairness report at rho, and
    the uniform classifier's risk ln K (`uniform_risk`) to read the risks against."""
    model = build_model(
        config.training.model,
        federation.num_features,
        federation.num_classes,
        image_shape=federation.image_shape,
        dtype=config.training.torch_dtype,
    )
    train = evaluate(model, theta, federation.pooled("train"))
    threshold = c if c is not None else cvar_threshold(train.losses, config.objective.rho)
    exact, smooth = training_objectives(train.losses, threshold, config.objective)
    test = evaluate(model, theta, federation.pooled("test"))
    report = pooled.group_risk_report(test.losses, test.correct, config.objective.rho)
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
    return {
        "config": config.to_dict(),
        "final": final_report(config, federation, outcome.theta, outcome.c),
        "history": outcome.history,
        "privacy": outcome.privacy,
        "seconds": time.perf_counter() - started,
        "clients": {client.name: client.size for client in federation.train},
    }


def reference(config: ExperimentConfig, federation: Federation) -> dict[str, Any]:
    """The centralized optimum of the smoothed objective, in the same JSON shape as `simulate`."""
    started = time.perf_counter()
    solution = solve_reference(federation, config.objective, model_name=config.training.model, seed=config.training.seed)
    final = final_report(replace(config, training=replace(config.training, dtype="float64")), federation, solution.theta, solution.c)
    final["train_objective_smooth_solver"] = solution.objective_smooth
    return {
        "config": config.to_dict(),
        "final": final,
        "history": [{"iterations": solution.iterations}],
        "seconds": time.perf_counter() - started,
        "clients": {client.name: client.size for client in federation.train},
    }


