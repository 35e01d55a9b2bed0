"""Institutions' own tables under one [schema], end to end over loopback mutual TLS.

Three sites hold their own CSV files cut from Adult by age band (so their
distributions barely overlap, and one site has no row of one race). The plan names
the schema; the aggregator runs the statistics aggregation (one secure sum of counts
and sums), serves the encoder with every start stage, trains five rounds under
secure aggregation, writes the model bundle and sends it to every collaborator. A
fourth institution, which took no part, scores its own table with `fedfair predict`.

The parties run in threads of the test (the real gRPC server over loopback mutual TLS, real
`Collaborator`s): their start-ups as processes would cost most of the test's CPU, and launch's tests
run a [schema] federation of processes (tests/runtime/local/test_rehearsal.py, test_launch.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedfair.bundle import load_bundle
from fedfair.bundle.commands import class_probabilities
from fedfair.cli import main as cli_main
from fedfair.core import server
from fedfair.core.data import ClientData
from fedfair.core.update import bounded
from fedfair.core.evaluation import evaluate
from fedfair.core.models import flat_parameters
from fedfair.datasets.builtin import ADULT_COLUMNS
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.schema import Column, draft_schema
from fedfair.datasets.statistics import encoder_from_statistics, statistics_vector
from fedfair.fairness import pooled
from fedfair.runtime.output_folder import BUNDLE_NAME
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.trainer import (
    LocalTable,
    build_learner,
    check_schema_table,
    encoded_data,
)
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import (
    load_aggregator_plan,
    load_shared_settings,
    shared_settings,
)
from fedfair.runtime.preprocessing import model_for
from tests.federations import adult_raw_table
from tests.runtime.harness import plan_sections, thread_federation

NAMES = ["site-a", "site-b", "site-c"]
FEATURES = [name for name in ADULT_COLUMNS if name not in ("fnlwgt", "income")]
ROUNDS = 5

pytestmark = pytest.mark.slow


def institutions(table: pd.DataFrame) -> list[pd.DataFrame]:
    """Three sites by age band (the oldest has no Amer-Indian-Eskimo row), and a fourth, outside
    the federation, holding every 10th row of the middle band."""
    absent = table["race"] == "Amer-Indian-Eskimo"
    oldest = table["age"] >= 48
    young = table[(table["age"] < 33) | (oldest & absent)]
    middle = table[(table["age"] >= 33) & ~oldest]
    outsider = middle.iloc[::10]
    return [young, middle.drop(outsider.index), table[oldest & ~absent], outsider]


def test_three_institutions_own_tables_train_one_model_that_a_fourth_can_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = adult_raw_table()
    sites = institutions(table)
    assert "Amer-Indian-Eskimo" not in set(sites[2]["race"]) and "Amer-Indian-Eskimo" in set(sites[0]["race"])
    paths = []
    for name, site in zip([*NAMES, "outsider"], sites, strict=True):
        path = tmp_path / "tables" / f"{name}.csv"
        path.parent.mkdir(exist_ok=True)
        site.to_csv(path, index=False)
        paths.append(path)

    # The schema the institutions agreed on: categories listed, native-country learnt from the sum.
    drafted = draft_schema(table, "income", FEATURES)
    columns = tuple(
        Column(column.name, column.kind, None) if column.name == "native-country" else column
        for column in drafted.columns
    )
    schema = dataclasses.replace(drafted, columns=columns)
    workspace = make_workspace(
        tmp_path / "federation",
        NAMES,
        plan=plan_sections(training={"rounds": ROUNDS}, quorum={"min_collaborators": 3}),
        data={name: {"csv": str(path)} for name, path in zip(NAMES, paths, strict=False)},
    )
    workspace.plan.write_text(workspace.plan.read_text() + "\n" + schema.to_toml())
    plan = load_aggregator_plan(workspace.plan)
    assert plan.schema == schema

    with thread_federation(workspace) as federation:
        federation.join()
    assert not federation.errors, federation.errors
    assert federation.exits == dict.fromkeys(NAMES, 0) and federation.summary["aborted_rounds"] == 0

    # The encoder is the one the exact sum of the three sites' training-row statistics gives.
    shared = load_shared_settings(shared_settings(plan))
    configs = [load_collaborator_config(workspace.configs[name]) for name in NAMES]
    checked = [check_schema_table(config, shared, LocalTable(None, pd.read_csv(config.data.csv))) for config in configs]
    expected_encoder = encoder_from_statistics(
        schema, np.sum([statistics_vector(schema, site.train, site.source) for site in checked], axis=0)
    )
    bundle_path = workspace.output / BUNDLE_NAME
    bundle = load_bundle(bundle_path)
    assert bundle.encoder is not None
    encoder = Encoder.from_mapping(bundle.encoder, "the bundle")
    assert encoder == expected_encoder
    assert bundle.architecture["features"] == encoder.num_features
    assert bundle.provenance["rounds"] == ROUNDS and bundle.provenance["contributions"] == dict.fromkeys(NAMES, ROUNDS)
    assert [record["round"] for record in bundle.metrics] == list(range(1, ROUNDS + 1))

    # Every collaborator received the very same bundle.
    for name in NAMES:
        received = workspace.configs[name].parent / f"{name}.{plan.federation_id}.model_bundle.pt"
        assert received.read_bytes() == bundle_path.read_bytes(), name

    # The federation trained what each site's own learner, summed in process, trains on the same encoded rows.
    log = read_round_log(workspace.output)
    assert all(record["status"] == "applied" and record["contributors"] == NAMES for record in log)
    with_model = dataclasses.replace(shared, model=model_for(shared.model, encoder))
    learners = [
        build_learner(encoded_data(config, site, encoder), with_model, torch.device("cpu"), name=config.name)
        for config, site in zip(configs, checked, strict=True)
    ]
    expected = server.init(initial_state(plan, encoder).theta, bound=plan.objective.bound)
    for _ in range(ROUNDS):
        # Weighted and bounded as each collaborator's own code does it (the plan's [influence]: equal weights here).
        updates = [
            bounded(
                learner.train_round(expected.theta, expected.c),
                plan.influence.weight_of(name, plan.batch_fraction),
                plan.influence.update_norm,
            )
            for name, learner in zip(NAMES, learners, strict=True)
        ]
        expected = plan.algorithm().server_apply(  # the plan's server step, its momentum included
            expected, server.Aggregate.of(updates), average_from=plan.training.average_from_round
        )
    # Each round's decoded mean update is off by at most its logged bound (fixed-point encoding).
    bound = sum(record["mean_update_error_bound"] for record in log)
    model = bundle.build_model()
    theta = flat_parameters(model).double()
    # The bundle's weights are the float64 average rounded once to float32: half an ulp, 2^-24 relative.
    float32 = expected.theta_average.abs().max().item() * 2.0**-24 + bound * 2.0**-24
    assert (theta - expected.theta_average).abs().max().item() <= bound + float32
    assert bundle.threshold == pytest.approx(expected.c_average, abs=bound)  # c-bar is kept in float64

    # The fourth institution scores its own table with the bundle: what the model gives in process.
    out = tmp_path / "predictions.csv"
    assert cli_main(["predict", "--model", str(bundle_path), "--data", str(paths[3]), "--out", str(out)]) == 0
    predicted = pd.read_csv(out)
    features, labels = encoder.encode(pd.read_csv(paths[3]), "outsider")
    in_process = class_probabilities(model, features)
    assert len(predicted) == len(sites[3])
    np.testing.assert_allclose(predicted[["probability_<=50K", "probability_>50K"]].to_numpy(), in_process, atol=1e-6)
    # `fedfair evaluate` reports what the pooled report gives on the same rows.
    assert labels is not None
    capsys.readouterr()
    assert cli_main(["evaluate", "--model", str(bundle_path), "--data", str(paths[3]), "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)
    data = ClientData("outsider", torch.as_tensor(features), torch.as_tensor(labels))
    result = evaluate(model, flat_parameters(model), data)
    exact = pooled.group_risk_report(result.losses, result.correct, plan.objective.rho)
    assert reported["rows"] == len(sites[3])
    for key in ("worst_risk", "mean_risk", "accuracy"):
        assert reported[key] == pytest.approx(getattr(exact, key), abs=1e-9), key
