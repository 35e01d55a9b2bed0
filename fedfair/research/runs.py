"""The runs of a study: each one set of `fedfair simulate` flags and a split, trained once and cached.

A run's result is cached under ``OUT/cache/`` by the SHA-256 of its flags and split, so an
interrupted study resumes where it stopped. Runs go to a process pool (every core by
default, each process with one compute thread) or to a Ray cluster.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from fedfair.core.config import ObjectiveConfig, TrainingConfig
from fedfair.core.errors import AggregateError, ConfigError
from fedfair.core.evaluation import evaluate
from fedfair.core.objective import cvar
from fedfair.core.server import ServerState
from fedfair.privacy.config import PrivacyConfig
from fedfair.research import minimax, stopping
from fedfair.fairness import composition, pooled
from fedfair.fairness.report import GroupRiskReport
from fedfair.research.experiment import (
    ExperimentConfig,
    evaluation_model,
    held_out_columns,
    held_out_losses,
    load_federation,
    run_method,
)
from fedfair.research.flags import config_from_flags
from fedfair.research.baselines import FedAvgSettings
from fedfair.research.methods import own
from fedfair.research.minimax import FedMinMaxSettings
from fedfair.research.study_options import RAY_INSTALL_HINT
from fedfair.runtime.observe.progress import Progress
from fedfair.simulation.federation import Federation, federation_from_arrays, history_sample
from fedfair.simulation.rounds import SimulationOptions
from fedfair.research.workers import process_pool

CACHE_VERSION = 1
"""Part of every cache key: bump it when a run's result would change for the same flags."""

BUILD_STAMP = "torch-build.txt"
"""The file beside a cache's runs naming the torch build they were trained under (:func:`check_build`)."""

VALIDATION_FRACTION = 0.2
"""Share of each client's training rows held back to choose hyperparameters."""


@dataclass(frozen=True)
class Run:
    """One training run: `fedfair simulate` flags and the split it is judged on ("validation" or "test")."""

    flags: tuple[str, ...]
    split: str
    rhos: tuple[float, ...] = ()
    """More rhos to judge the same model at (a method without rho trains once for every rho)."""
    composition: tuple[str, ...] = ()
    """Group columns to describe the worst group by, with the label, at every rho judged (test runs)."""
    history_every: int = 0
    """Rounds between the points of the output iterate's training trace kept with the result (0: none kept)."""
    row_losses: bool = False
    """Keep every held-out row's loss with the result (`row_losses`), for paired comparisons (test runs)."""
    validation_every: int = 0
    """Rounds between the checkpoints kept as ``checkpoints`` (0: none): the validation worst risk, at the run's rho
    and each of `rhos`, of the output a run stopped there would give (`stopping.checkpoints`; validation runs)."""

    def __post_init__(self) -> None:
        """Refuse (ConfigError) a composition or checkpoints asked of the wrong split, or a negative cadence."""
        if self.composition and self.split != "test":
            raise ConfigError("the worst group's composition is described on the test rows; ask it of test runs")
        if self.history_every < 0:
            raise ConfigError(f"history_every is a number of rounds (0: no history), got {self.history_every}")
        if self.validation_every < 0:
            raise ConfigError(
                f"validation_every is a number of rounds (0: no checkpoints), got {self.validation_every}"
            )
        if self.validation_every and self.split != "validation":
            raise ConfigError(
                "a stop round is chosen on validation rows, never the test rows: ask it of validation runs"
            )

    @property
    def key(self) -> str:
        """The run's cache key (hex SHA-256): its flags, split, cache version and what else it is asked."""
        described: dict[str, Any] = {"flags": list(self.flags), "split": self.split, "version": CACHE_VERSION}
        # Only what is asked for enters the key, so a run judged at its own rho keeps the key it always had.
        if self.rhos:
            described["rhos"] = list(self.rhos)
        if self.composition:
            described["composition"] = list(self.composition)
        if self.history_every:
            described["history_every"] = self.history_every
        if self.row_losses:
            described["row_losses"] = True
        if self.validation_every:
            described["validation_every"] = self.validation_every
        text = json.dumps(described)
        return hashlib.sha256(text.encode()).hexdigest()


def row_losses(result: Mapping[str, Any]) -> np.ndarray:
    """The held-out rows' losses a run kept (`Run.row_losses`), in the rows' order, as float32.

    Raises:
        ConfigError: the run did not keep them.
    """
    if "row_losses" not in result:
        raise ConfigError("this run kept no per-row losses; ask them with Run(row_losses=True)")
    return np.frombuffer(base64.b64decode(result["row_losses"]), dtype="<f4")


def row_errors(result: Mapping[str, Any]) -> np.ndarray | None:
    """The held-out rows' 0-1 errors, read off the losses a two-class run kept; None where they cannot be.

    With two classes the model predicts the class whose probability is above ½, so a row is an error exactly
    where its true class's probability is below ½: where its loss, -ln p, is above ln 2. With more classes a loss
    above ln 2 does not say which class won, so a run of more than two classes reads None; so does one whose
    errors so read do not count its own error rate's (a tie at ½ that the losses' float32 rounding hides).

    Raises:
        ConfigError: the run did not keep its row losses.
    """
    losses = row_losses(result).astype(np.float64)
    if int(result["classes"]) != 2:
        return None
    errors = losses > math.log(2.0)
    return errors if int(errors.sum()) == round(float(result["mean_error"]) * losses.size) else None


def judged_at(result: Mapping[str, Any], rho: float) -> Mapping[str, Any]:
    """A run's held-out report at `rho`: its own (the run's --rho) or one of its extra rhos."""
    if math.isclose(float(result["rho"]), rho) or "diverged" in result:  # a diverged run is NaN at every rho
        return result
    try:
        report: Mapping[str, Any] = result["at_rho"][f"{rho:g}"]
    except KeyError:
        raise ConfigError(f"the run was judged at rho {result['rho']:g} only, not {rho:g}") from None
    return report


# ---------------------------------------------------------------- one run


def validation_federation(federation: Federation, seed: int) -> Federation:
    """Each client's training rows split 80 / 20 into training and validation rows (seeded)."""
    generator = np.random.default_rng(seed)
    train, validation, names, kept = [], [], [], []
    for client in federation.train:
        order = generator.permutation(client.size)
        held = max(1, round(VALIDATION_FRACTION * client.size))
        if held >= client.size:
            raise ConfigError(f"client {client.name} has {client.size} training rows, too few to hold some back")
        features, labels = client.features.numpy(), client.labels.numpy()
        train.append((features[order[held:]], labels[order[held:]]))
        validation.append((features[order[:held]], labels[order[:held]]))
        names.append(client.name)
        kept.append(order[held:])
    carved = federation_from_arrays(names, train, validation, federation.num_classes, federation.image_shape)
    if isinstance(federation, minimax.GroupedFederation):  # FedMinMax's groups follow their rows
        groups = [group[rows] for group, rows in zip(federation.train_groups, kept, strict=True)]
        return minimax.with_groups(carved, groups, federation.group_names)
    return carved


def federation_for(flags: tuple[str, ...], split: str) -> Federation:
    """The run's federation; a worker builds each (data, split, seed) once, however many runs share it."""
    config = config_from_flags(flags)
    grouped = config.method == "fedminmax"
    data = dataclasses.replace(
        config,
        # Only FedMinMax's federation carries groups (its settings name the column); any other loads alike.
        method="fedminmax" if grouped else "fedavg",
        settings=FedMinMaxSettings(groups=own(config.settings, FedMinMaxSettings).groups)
        if grouped
        else FedAvgSettings(),
        objective=ObjectiveConfig(),
        training=TrainingConfig(seed=config.training.seed),
        simulation=SimulationOptions(),
        # How a run trains and sums (DP, the secure sum) is not its data, and the method above need not take it.
        privacy=PrivacyConfig(),
        secure_aggregation=False,
        colluders=None,
    )
    return _data_federation(data, split)


@cache
def _data_federation(config: ExperimentConfig, split: str) -> Federation:
    federation = load_federation(config)
    return validation_federation(federation, config.training.seed) if split == "validation" else federation


def execute(run: Run) -> dict[str, Any]:
    """Train one run and judge it on its split's held-out rows (the report of `fedfair simulate`)."""
    import torch

    torch.set_num_threads(1)
    started = time.process_time()
    config = config_from_flags(run.flags)
    # The result keeps no per-round history (a traced run measures its own, `traced`), and recording it
    # evaluated both iterates on 20,000 training rows 20 times a run: half a Census-Income run's CPU.
    config = dataclasses.replace(config, simulation=dataclasses.replace(config.simulation, record_every=0))
    federation = federation_for(run.flags, run.split)
    result: dict[str, Any] = {"flags": list(run.flags), "split": run.split, "classes": federation.num_classes}
    callbacks = []
    # Each filled as the rounds go, so a run that diverges keeps its trace up to its failure.
    if run.history_every:
        result["history"] = []
        callbacks.append(traced(run, config, federation, result["history"]))
    if run.validation_every:
        result["checkpoints"] = []
        callbacks.append(validated(run, config, federation, result["checkpoints"]))

    def on_round(state: ServerState) -> None:
        for callback in callbacks:
            callback(state)

    try:
        outcome = run_method(config, federation, on_round if callbacks else None)
    except AggregateError as error:  # this point of the grid diverged: its NaN risks are never chosen
        diverged = {
            field.name: math.nan for field in dataclasses.fields(GroupRiskReport) if field.name != "certificate"
        }
        return {
            **result,
            **diverged,
            "rho": config.objective.rho,
            "diverged": str(error),
            "cpu_seconds": time.process_time() - started,
        }
    # The held-out losses once, for the report of `fedfair simulate` at every rho judged.
    losses, correct = held_out_losses(config, federation, outcome.theta)
    result.update(pooled.group_risk_report(losses, correct, config.objective.rho).to_dict())
    if run.row_losses:
        result["row_losses"] = base64.b64encode(np.asarray(losses, dtype="<f4").tobytes()).decode("ascii")
    if run.rhos:
        result["at_rho"] = {f"{rho:g}": pooled.group_risk_report(losses, correct, rho).to_dict() for rho in run.rhos}
    if run.composition:
        columns = held_out_columns(config, run.composition)
        result["composition"] = {
            f"{rho:g}": [
                share.to_dict(list(columns))
                for share in composition.composition(composition.worst_fraction_weights(losses, rho), columns)
            ]
            for rho in (config.objective.rho, *run.rhos)
        }
    # The run's cost, for the tables' budgets (its key does not hold it: a rerun costs what its machine costs).
    result["cpu_seconds"] = time.process_time() - started
    return result


def traced(
    run: Run, config: ExperimentConfig, federation: Federation, trace: list[dict[str, Any]]
) -> Callable[[ServerState], None]:
    """A round callback appending the output iterate's training trace to `trace`.

    Every `run.history_every` rounds and at the last: the mean loss and the exact CVaR at the run's rho and
    each of its extra rhos (keyed as in ``at_rho``) of the averaged iterate, the one every method outputs
    (`experiment.run_method`), on the pooled training rows the simulation's own history reads
    (`history_sample`). Measured here rather than in the simulation's history, which knows no rho for
    the methods without one: the same quantity for every method, and training untouched (evaluating
    draws nothing from any generator).
    """
    model = evaluation_model(config, federation)
    sample = history_sample(federation)
    rhos = (config.objective.rho, *run.rhos)

    def record(state: ServerState) -> None:
        if state.round % run.history_every and state.round != config.training.rounds:
            return
        losses = evaluate(model, state.theta_average, sample).losses
        worst = {f"{rho:g}": cvar(losses, rho) for rho in rhos}
        trace.append({"round": state.round, "mean_loss": float(losses.mean()), "worst_risk": worst})

    return record


def validated(
    run: Run, config: ExperimentConfig, federation: Federation, trace: list[dict[str, Any]]
) -> Callable[[ServerState], None]:
    """A round callback appending, every `run.validation_every` rounds, the held-out worst risk of a run stopped there.

    The held-out rows are the validation rows of a validation run; the worst risk is the exact CVaR at the run's
    rho and each of its extra rhos (keyed as in ``at_rho``) of the output a run of that many rounds gives
    (`stopping.checkpoints`). Training is untouched: evaluating draws nothing from any generator.
    """
    rhos = (config.objective.rho, *run.rhos)

    def emit(round_number: int, theta: Any) -> None:
        losses, _ = held_out_losses(config, federation, theta)
        trace.append({"round": round_number, "worst_risk": {f"{rho:g}": cvar(losses, rho) for rho in rhos}})

    training = config.training
    return stopping.checkpoints(training.average_from, run.validation_every, training.rounds, emit)


def check_build(cache_folder: Path) -> None:
    """Stamp `cache_folder` with this process's torch build, or refuse it if another build filled it.

    A run's key is its flags, yet its figures depend on the torch build too: one MNIST PropFair run read
    0.97096 under torch 2.11 and 0.96160 under 2.13 for the same flags, enough to change a study's choice.
    A cache filled before the stamp existed is taken to be this build's.

    Raises:
        ConfigError: the stamp names another build.
    """
    import torch

    build = torch.__version__
    stamp = cache_folder / BUILD_STAMP
    if not stamp.exists():
        stamp.write_text(build + "\n")
        return
    stamped = stamp.read_text().strip()
    if stamped != build:
        raise ConfigError(
            f"the run cache {cache_folder} was filled under torch {stamped}, and this is torch {build}: a run's "
            f"figures depend on the build, so the two must not mix; run under torch {stamped}, or give --out a "
            "fresh folder"
        )


def run_all(
    runs: Iterable[Run], cache_folder: Path, workers: int, label: str, on_ray: bool = False
) -> dict[Run, dict[str, Any]]:
    """Every run's result, from the cache where it is there, else computed and cached as it arrives.

    Runs are computed in `workers` local processes or, with `on_ray`, as Ray tasks of one CPU
    each on the cluster this process is connected to (see :func:`ray_connection`); `workers`
    is then unused, the cluster's free CPUs decide how many run at once, and each node must have
    this process's torch build (:func:`check_build` reads this process's alone).

    Raises:
        ConfigError: the cache was filled under another torch build (:func:`check_build`).
    """
    cache_folder.mkdir(parents=True, exist_ok=True)
    check_build(cache_folder)
    unique = list(dict.fromkeys(runs))
    results: dict[Run, dict[str, Any]] = {}
    missing = []
    for run in unique:
        path = cache_folder / f"{run.key}.json"
        if path.exists():
            results[run] = json.loads(path.read_text())
        else:
            missing.append(run)
    with Progress(len(missing), label, unit="run") as shown:
        done = 0

        def keep(run: Run, result: dict[str, Any]) -> None:
            nonlocal done
            path = cache_folder / f"{run.key}.json"
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(result, sort_keys=True))
            temporary.replace(path)  # a run is cached whole or not at all
            results[run] = result
            done += 1
            shown.update(done)

        if on_ray:
            _run_on_ray(missing, keep)
        elif workers <= 1:
            for run in missing:
                keep(run, execute(run))
        else:
            with process_pool(workers) as pool:
                for run, result in zip(missing, pool.map(execute, missing), strict=True):
                    keep(run, result)
    return results


def _import_ray() -> Any:
    """The `ray` module, imported only when asked for: fedfair needs it for nothing else."""
    try:
        import ray
    except ImportError as error:
        raise ConfigError(f"--ray needs Ray, which is not installed: {RAY_INSTALL_HINT}") from error
    return ray


@contextmanager
def ray_connection(address: str) -> Iterator[None]:
    """Connected to a Ray cluster for the duration.

    "local" starts a private instance on this machine's cores (and stops it after), "auto" or HOST:PORT joins an
    existing cluster.
    """
    ray = _import_ray()
    if address == "local":
        ray.init(include_dashboard=False)
    else:
        ray.init(address=address)
    try:
        yield
    finally:
        ray.shutdown()


def _run_on_ray(runs: Sequence[Run], keep: Callable[[Run, dict[str, Any]], None]) -> None:
    """Every run as a one-CPU Ray task, each result kept as soon as it completes (any order)."""
    ray = _import_ray()
    if not ray.is_initialized():
        raise ConfigError("run_all(on_ray=True) needs a Ray connection: call it inside ray_connection(ADDRESS)")
    remote_execute = ray.remote(num_cpus=1)(execute)
    run_of = {remote_execute.remote(run): run for run in runs}
    waiting = list(run_of)
    while waiting:
        finished, waiting = ray.wait(waiting, num_returns=1)
        for reference in finished:
            keep(run_of[reference], ray.get(reference))
