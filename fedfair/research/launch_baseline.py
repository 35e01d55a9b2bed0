"""The exact comparison ``fedfair launch`` prints: FedSRCVaR's model, FedAvg's and two constants, on the same rows.

A rehearsal holds every institution's table on one machine, so what no real federation can do is possible
here: read each site's rows exactly as its collaborator read them (the same files, the same split into
training and held-out rows by the plan's seed, the same encoder, the federation's own from its noised
statistics), train FedAvg in process on the training rows with the plan's schedule, and evaluate both
models exactly on the union of the held-out rows with one function. The federation's private estimate
is printed beside this, labelled as what a real federation sees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedfair.core.errors import ConfigError, FedfairError
from fedfair.runtime.local.launch import Comparison

if TYPE_CHECKING:
    from fedfair.bundle.format import Bundle
    from fedfair.core.server import Aggregate
    from fedfair.core.update import Update
    from fedfair.runtime.local.workspace import Workspace
    from fedfair.runtime.plan.aggregator_plan import AggregatorPlan
    from fedfair.simulation.federation import Federation
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


def final_bundle(workspace: Workspace) -> Path:
    """The model bundle the first site kept (every site keeps the same final model)."""
    name, config = next(iter(workspace.configs.items()))
    found = sorted(config.parent.glob(f"{name}.*.model_bundle.pt"))
    if not found:
        raise FedfairError(f"{name} kept no model bundle in {config.parent}; see its log in {workspace.root / 'logs'}")
    return found[0]


def site_rows(workspace: Workspace, plan: AggregatorPlan, bundle: Bundle) -> Federation:
    """Every site's training and held-out rows as its collaborator read them, encoded as the federation encoded them.

    The collaborator's own functions do the reading and the split (by the plan's seed), so the rows are the
    ones the sites trained and answered the evaluation on; a [schema] table is encoded with the bundle's
    encoder, which is the federation's.
    """
    from fedfair.bundle.commands import bundle_encoder
    from fedfair.runtime.collaborator.config import load_collaborator_config
    from fedfair.runtime.collaborator.trainer import (
        check_schema_table,
        encoded_data,
        load_local_data,
        read_local_data,
    )
    from fedfair.runtime.plan.aggregator_plan import load_shared_settings, shared_settings
    from fedfair.simulation.federation import Federation

    shared = load_shared_settings(shared_settings(plan), source=str(workspace.plan))
    encoder = bundle_encoder(bundle) if shared.schema is not None else None
    train, test, classes = [], [], 0
    for path in workspace.configs.values():
        config = load_collaborator_config(path)
        table = read_local_data(config)
        if encoder is not None:
            data = encoded_data(config, check_schema_table(config, shared, table), encoder)
        else:
            data = load_local_data(config, shared, table)
        train.append(data.train)
        test.append(data.test)
        classes = data.num_classes
    return Federation(tuple(train), tuple(test), int(train[0].features.shape[1]), classes)


def plan_aggregate(plan: AggregatorPlan, names: Sequence[str]) -> Callable[[list[Update]], Aggregate]:
    """The plain sum of a round's updates as the plan's collaborators would send them.

    Each weighted by the plan's [influence] weight (not its batch, unless the plan declares so) and bounded
    by its update norm, as :func:`fedfair.core.update.bounded` bounds a collaborator's upload; updates come in
    `names`' order.
    """
    from fedfair.core.server import Aggregate
    from fedfair.core.update import bounded

    influence = plan.influence
    weights = [influence.weight_of(name, plan.batch_fraction) for name in names]

    def aggregate(updates: list[Update]) -> Aggregate:
        return Aggregate.of(
            bounded(update, weight, influence.update_norm) for update, weight in zip(updates, weights, strict=True)
        )

    return aggregate


def exact_comparison(workspace: Workspace, plan: AggregatorPlan) -> dict[str, dict[str, float]]:
    """FedSRCVaR's final model and an in-process FedAvg, each evaluated exactly on the sites' held-out rows.

    Each report is :func:`fedfair.fairness.pooled.group_risk_report`'s, with "rows": the held-out rows' count. After
    the two models, the two constants every fairness figure is read against, on the same rows
    (:mod:`fedfair.fairness.references`): the uniform classifier h̄ and the base rate of the sites' training rows.

    FedAvg trains on the sites' training rows with the plan's schedule (rounds, local steps, batch fraction,
    step size, seed, suffix averaging) and its [influence] weights and update bound (:func:`plan_aggregate`): the
    plan's federation with epsilon = 1. Both reports come from one
    function on one set of rows, so their difference is the objectives', not the measurement's.
    """
    import dataclasses

    from fedfair.bundle.format import load_bundle
    from fedfair.core.evaluation import evaluate
    from fedfair.core.models import flat_parameters
    from fedfair.fairness.pooled import group_risk_report
    from fedfair.fairness.references import reference_reports
    from fedfair.simulation.rounds import run_rounds

    bundle = load_bundle(final_bundle(workspace))
    federation = site_rows(workspace, plan, bundle)
    held_out = federation.pooled("test")
    rho = plan.objective.rho
    model = bundle.build_model()
    fedsrcvar = evaluate(model, flat_parameters(model), held_out)
    aggregate = plan_aggregate(plan, list(workspace.configs))
    trained = run_rounds(federation, plan.training, None, options=simulation_options(plan), aggregate=aggregate)
    fedavg_model = dataclasses.replace(plan.model, features=federation.num_features, classes=federation.num_classes)
    fedavg = evaluate(fedavg_model.build(), trained.state.theta_average, held_out)
    rows = {"rows": float(held_out.size)}
    constants = reference_reports(
        federation.pooled("train").labels.numpy(), held_out.labels.numpy(), federation.num_classes, rho
    )
    return {
        "FedSRCVaR": group_risk_report(fedsrcvar.losses, fedsrcvar.correct, rho).to_dict() | rows,
        "FedAvg": group_risk_report(fedavg.losses, fedavg.correct, rho).to_dict() | rows,
    } | {name: report.to_dict() | rows for name, report in constants.items()}


FEDAVG = Comparison(exact_comparison)
"""What `fedfair launch` compares the federation with, unless ``--no-fedavg``."""
