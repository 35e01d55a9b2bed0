"""FedAvg trained in process on a launched federation's data and schedule: the baseline ``fedfair launch`` shows."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fedfair.core.errors import ConfigError
from fedfair.runtime.local.launch import SPLITS, Baseline

if TYPE_CHECKING:
    from fedfair.runtime.plan.aggregator_plan import AggregatorPlan
    from fedfair.simulation.rounds import SimulationOptions


def simulation_options(plan: AggregatorPlan) -> SimulationOptions:
    """The in-process simulation's options for a plan: its built-in model (the schedule is `plan.training` itself)."""
    from fedfair.simulation.rounds import SimulationOptions

    if plan.model.factory is not None:
        raise ConfigError(
            f"the in-process simulation of a plan runs the built-in models only, not the factory "
            f"'{plan.model.factory}'; use fedfair.api.federate to simulate a federation of your own model"
        )
    return SimulationOptions(model=plan.model.name)


def fedavg_report(plan: AggregatorPlan, dataset: str = "adult") -> dict[str, float]:
    """FedAvg's held-out fairness report, trained in process on the federation `fedfair launch` ran.

    `dataset` is split as launch splits it (SPLITS) among the plan's collaborators, trained with the plan's
    rounds and batch fraction, and judged the same way as the federation, exactly: on the built-in encoding and
    held-out rows (Adult's test file), whatever the federation's own (under a [schema], each site's table with
    the federation's noised encoder, a share of it held out) and without its evaluation noise.
    """
    from fedfair.core.evaluation import evaluate
    from fedfair.fairness import pooled
    from fedfair.research import baselines
    from fedfair.research.experiment import ExperimentConfig, load_federation

    config = ExperimentConfig(dataset=dataset, partition=SPLITS[dataset].partition, clients=len(plan.collaborators))
    federation = load_federation(config)
    result = baselines.run_fedavg(federation, plan.training, options=simulation_options(plan))
    # A plan with a [schema] leaves the input size to its encoder: the baseline's is the built-in encoding's.
    model = dataclasses.replace(plan.model, features=federation.num_features, classes=federation.num_classes)
    test = evaluate(model.build(), result.state.theta_average, federation.pooled("test"))
    return pooled.group_risk_report(test.losses, test.correct, plan.objective.rho).to_dict()


FEDAVG = Baseline(
    "FedAvg (in-process, exact)",
    fedavg_report,
    "The FedAvg row is trained in this process on the same sites' rows in the built-in encoding, and judged "
    "exactly on Adult's own test file, with no noise.",
)
"""The row `fedfair launch` prints under the federation's, unless ``--no-fedavg``."""
