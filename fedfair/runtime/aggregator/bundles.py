"""The aggregator's model: round 0's weights, and the bundle written at every checkpoint and sent at the end.

The bundle (:mod:`fedfair.bundle`) holds the output model (theta-bar in the plan's
architecture), its threshold c-bar, the federation's encoder under a [schema], the
settings every collaborator received (no names, no paths), the metrics of every round
so far and the provenance: rounds run and how many rounds each institution
contributed to, never anything of their data. It is rewritten atomically after each
round, so the output folder always holds the model of its latest checkpoint, and the
final one is offered to every collaborator with the FINISHED task.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fedfair.bundle import Bundle, make_provenance, write_bundle
from fedfair.core import server
from fedfair.core.models import flat_parameters, load_flat_parameters
from fedfair.datasets.encoder import Encoder
from fedfair.runtime.aggregator.checkpoint import Checkpoint
from fedfair.runtime.aggregator.state import output_values
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, shared_settings
from fedfair.runtime.preprocessing import model_for
from fedfair.runtime.plan.model import ModelSettings
from fedfair.runtime.output_folder import BUNDLE_NAME

ROUND_METRICS = ("round", "status", "participants", "contributors", "c", "c_average", "total_weight")
"""What a bundle's metrics keep of each round record (the evaluation too, when the round had one)."""


def model_settings(plan: AggregatorPlan, encoder: Encoder | None) -> ModelSettings:
    """The plan's model, with the input size and classes of the federation's encoder under a [schema]."""
    return plan.model if encoder is None else model_for(plan.model, encoder, plan.own_factories)


def initial_state(plan: AggregatorPlan, encoder: Encoder | None = None) -> server.ServerState:
    """Round 0.

    The plan's model with its seed's initial weights, c at the bound B (as the simulation), and with drift
    correction a zero control variate; under a [schema], the model's input size and classes are the federation's
    encoder's.
    """
    model = model_settings(plan, encoder).build(seed=plan.training.seed, allowed=plan.own_factories)
    return plan.algorithm().server_init(flat_parameters(model))


def checkpoint_encoder(checkpoint: Checkpoint) -> Encoder | None:
    """The encoder a checkpoint keeps (None for plans without a [schema])."""
    if checkpoint.encoder is None:
        return None
    return Encoder.from_mapping(checkpoint.encoder, "the checkpoint's encoder")


def federation_bundle(plan: AggregatorPlan, checkpoint: Checkpoint, records: Sequence[Mapping[str, Any]]) -> Bundle:
    """The bundle of `checkpoint`'s output model (theta-bar, c-bar), with the metrics of `records`."""
    encoder = checkpoint_encoder(checkpoint)
    settings = model_settings(plan, encoder)
    model = settings.build(seed=plan.training.seed, allowed=plan.own_factories)
    # theta-bar as a download carries it: float32 for a built-in model (its parameters' own type), by span.
    load_flat_parameters(model, torch.from_numpy(output_values(checkpoint.state, plan.model.factory is None)))
    contributions = Counter(name for record in records for name in record.get("contributors", ()))
    metrics = [
        {
            **{key: record[key] for key in ROUND_METRICS if key in record},
            **({"evaluation": record["evaluation"]} if "evaluation" in record else {}),
        }
        for record in records
    ]
    return Bundle(
        state_dict={name: tensor.detach().clone() for name, tensor in model.state_dict().items()},
        architecture=settings.architecture(),
        encoder=None if encoder is None else encoder.to_mapping(),
        threshold=float(checkpoint.state.c_average),
        plan=json.loads(shared_settings(plan)),
        metrics=metrics,
        provenance=make_provenance(checkpoint.round, contributions),
    )


def save_federation_bundle(plan: AggregatorPlan, checkpoint: Checkpoint, records: Sequence[Mapping[str, Any]]) -> Path:
    """Write the bundle of `checkpoint` into the output folder (atomically); return its path."""
    path = plan.aggregator.output / BUNDLE_NAME
    with torch.no_grad():
        write_bundle(path, federation_bundle(plan, checkpoint, records))
    return path
