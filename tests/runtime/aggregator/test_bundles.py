"""The aggregator's model bundle, and the checkpoint that carries a [schema] federation's encoder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import torch

from fedfair.bundle import load_bundle
from fedfair.core import server
from fedfair.core.models import flat_parameters
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.schema import draft_schema
from fedfair.datasets.statistics import encoder_from_statistics, statistics_vector
from fedfair.runtime.output_folder import BUNDLE_NAME
from fedfair.runtime.aggregator.bundles import save_federation_bundle
from fedfair.runtime.aggregator.checkpoint import (
    Checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, plan_digest


def small_encoder() -> Encoder:
    table = pd.DataFrame({"age": [30, 41, 52, 63], "colour": ["red", "blue", "red", "green"], "label": [0, 1, 0, 1]})
    schema = draft_schema(table, "label")
    return encoder_from_statistics(schema, statistics_vector(schema, table))


def test_a_checkpoint_keeps_the_encoder_so_a_resumed_run_serves_the_same_one(tmp_path: Path) -> None:
    encoder = small_encoder()
    state = server.init(torch.arange(5, dtype=torch.float64), bound=3.0)
    save_checkpoint(tmp_path, Checkpoint(0, state, "digest", encoder=encoder.to_mapping()))
    loaded = load_checkpoint(tmp_path, "digest")
    assert loaded.encoder is not None and Encoder.from_mapping(loaded.encoder, "checkpoint") == encoder
    save_checkpoint(tmp_path, Checkpoint(1, state, "digest"))
    assert load_checkpoint(tmp_path, "digest").encoder is None


def test_the_bundle_holds_the_output_model_and_who_contributed_how_often(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path, ["site-a", "site-b"], plan={"model": {"name": "mlp"}})
    plan = load_aggregator_plan(workspace.plan)
    plan.aggregator.output.mkdir(parents=True)
    start = initial_state(plan)
    # An output model that differs from both the last iterate and theta_0: the bundle must hold theta-bar.
    state = dataclasses.replace(start, theta=start.theta + 1.0, theta_average=start.theta * 0.5, c_average=2.5)
    records = [
        {"round": 1, "status": "applied", "contributors": ["site-a", "site-b"], "c": 3.0},
        {"round": 2, "status": "aborted", "reason": "too few survivors"},
        {"round": 3, "status": "applied", "contributors": ["site-b"], "c": 2.0, "evaluation": {"status": "done"}},
    ]
    path = save_federation_bundle(plan, Checkpoint(3, state, plan_digest(plan)), records)
    assert path == plan.aggregator.output / BUNDLE_NAME
    bundle = load_bundle(path)
    assert torch.equal(flat_parameters(bundle.build_model()).double(), (start.theta * 0.5).float().double())
    assert bundle.threshold == 2.5 and bundle.encoder is None
    assert bundle.architecture == {"name": "mlp", "features": plan.model.features, "classes": 2, "image_shape": None}
    assert bundle.provenance["rounds"] == 3 and bundle.provenance["contributions"] == {"site-a": 1, "site-b": 2}
    assert [metric["round"] for metric in bundle.metrics] == [1, 2, 3] and "evaluation" in bundle.metrics[2]
    assert "aggregator" not in bundle.plan and "collaborators" not in bundle.plan["federation"]  # no names, no paths
