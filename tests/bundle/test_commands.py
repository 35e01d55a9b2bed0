"""`fedfair predict` and `fedfair evaluate` on a bundle of a small model trained here, with a real
schema encoder: predictions equal the in-process model's, row by row, and the evaluation equals
fedfair.fairness computed directly on the model's per-sample losses. A bundle whose model a factory
builds is used only with --allow-factory naming that factory; without it nothing is imported."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from fedfair.bundle import (
    Bundle,
    builtin_architecture,
    factory_architecture,
    load_bundle,
    make_provenance,
    write_bundle,
)
from fedfair.bundle.commands import PREDICTION_COLUMN, PROBABILITY_PREFIX
from fedfair.cli import main
from fedfair.core.models import build_model, output_units, per_sample_loss, predict
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.schema import draft_schema
from fedfair.datasets.statistics import encoder_from_statistics, statistics_vector
from fedfair.fairness.pooled import group_risk_report

CLASSES = {2: ["<=50K", ">50K"], 3: ["high", "low", "mid"]}


def linear(features: int, outputs: int) -> nn.Module:
    """A user's own model factory, "tests.bundle.test_commands:linear": the same layer as logreg."""
    return nn.Linear(features, outputs)


def leave_marker(marker: str) -> nn.Module:
    """A factory with a side effect: creates ``marker``, so a test sees whether it was ever called."""
    Path(marker).touch()
    return nn.Linear(1, 1)


def institution_table(rows: int, classes: int, seed: int) -> pd.DataFrame:
    """A table as an institution keeps it: numbers, a text column, a text label that depends on both."""
    generator = np.random.default_rng(seed)
    age = generator.integers(18, 90, rows)
    hours = generator.normal(40, 12, rows).round(1)
    sector = generator.choice(["private", "public", "self-employed"], rows)
    score = (age - 50) / 15 + (hours - 40) / 12 + (sector == "public") + generator.normal(0, 0.5, rows)
    cuts = np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1])
    label = np.asarray(CLASSES[classes], dtype=object)[np.digitize(score, cuts)]
    return pd.DataFrame({"age": age, "hours": hours, "sector": sector, "income": label})


def trained(name: str, encoder: Encoder, table: pd.DataFrame, classes: int) -> nn.Module:
    """A few dozen Adam steps: enough for predictions that differ from row to row."""
    features, labels = encoder.encode(table, "training table")
    assert labels is not None
    inputs, targets = torch.as_tensor(features), torch.as_tensor(labels)
    model = build_model(name, features.shape[1], classes, seed=3)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(60):
        optimiser.zero_grad()
        per_sample_loss(model(inputs), targets).mean().backward()
        optimiser.step()
    return model.eval()


@pytest.fixture(scope="module", params=[("logreg", 2), ("logreg", 3)], ids=["binary", "three-class"])
def bundle_file(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, nn.Module, Encoder, int]:
    """A bundle of a model trained here, written once per model kind and only read by the tests."""
    name, classes = request.param
    table = institution_table(400, classes, seed=0)
    schema = draft_schema(table, "income")
    encoder = encoder_from_statistics(schema, statistics_vector(schema, table))
    model = trained(name, encoder, table, classes)
    path = tmp_path_factory.mktemp(f"{name}-{classes}") / "final.bundle"
    write_bundle(
        path,
        Bundle(
            state_dict=model.state_dict(),
            architecture=builtin_architecture(name, encoder.num_features, classes),
            encoder=encoder.to_mapping(),
            threshold=0.42,
            plan={"objective": {"rho": 0.3, "epsilon": 0.1}},
            metrics=[],
            provenance=make_provenance(60, {"site-a": 60}),
        ),
    )
    return path, model, encoder, classes


def test_predict_writes_the_in_process_models_predictions_in_row_order(
    tmp_path: Path, bundle_file: tuple[Path, nn.Module, Encoder, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, model, encoder, classes = bundle_file
    unlabelled = institution_table(150, classes, seed=7).drop(columns="income")
    unlabelled.to_csv(tmp_path / "new.csv", index=False)

    command = ["predict", "--model", str(path), "--data", str(tmp_path / "new.csv"), "--out", str(tmp_path / "p.csv")]
    assert main(command) == 0
    assert "wrote 150 predictions" in capsys.readouterr().out

    written = pd.read_csv(tmp_path / "p.csv")
    names = CLASSES[classes]
    assert list(written.columns) == [PREDICTION_COLUMN, *(PROBABILITY_PREFIX + name for name in names)]
    features, _ = encoder.encode(unlabelled, "new rows")
    with torch.no_grad():
        logits = model(torch.as_tensor(features))
    if classes == 2:
        positive = torch.sigmoid(logits.squeeze(-1)).numpy()
        expected = np.stack([1.0 - positive, positive], axis=1)
    else:
        expected = torch.softmax(logits, dim=-1).numpy()
    probabilities = written[[PROBABILITY_PREFIX + name for name in names]].to_numpy()
    np.testing.assert_allclose(probabilities, expected, rtol=0, atol=1e-6)
    assert written[PREDICTION_COLUMN].tolist() == [names[index] for index in predict(logits).tolist()]
    # The model really separates rows, so equal order is a real check.
    assert written[PREDICTION_COLUMN].nunique() == classes


def test_predict_keeps_the_columns_asked_for_in_front_of_the_predictions(
    tmp_path: Path, bundle_file: tuple[Path, nn.Module, Encoder, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _, classes = bundle_file
    table = institution_table(40, classes, seed=3).drop(columns="income")
    table.insert(0, "patient_id", [f"P{index:03d}" for index in range(40)])
    table.to_csv(tmp_path / "new.csv", index=False)
    base = ["predict", "--model", str(path), "--data", str(tmp_path / "new.csv")]
    assert main([*base, "--out", str(tmp_path / "plain.csv")]) == 0
    assert main([*base, "--out", str(tmp_path / "kept.csv"), "--keep", "patient_id", "--keep", "age,patient_id"]) == 0
    plain, kept = pd.read_csv(tmp_path / "plain.csv"), pd.read_csv(tmp_path / "kept.csv")
    assert list(kept.columns) == ["patient_id", "age", *plain.columns]
    assert kept["patient_id"].tolist() == table["patient_id"].tolist() and kept["age"].tolist() == table["age"].tolist()
    pd.testing.assert_frame_equal(kept[list(plain.columns)], plain)  # the predictions are the same, in row order
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "bad.csv"), "--keep", "patient"]) == 2
    assert "--keep patient: the table has no such column; did you mean 'patient_id'?" in capsys.readouterr().err
    assert not (tmp_path / "bad.csv").exists()


def test_evaluate_reports_fairness_computed_directly(
    tmp_path: Path, bundle_file: tuple[Path, nn.Module, Encoder, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, model, encoder, classes = bundle_file
    held_out = institution_table(200, classes, seed=11)
    held_out.to_csv(tmp_path / "held_out.csv", index=False)
    features, labels = encoder.encode(held_out, "held-out rows")
    assert labels is not None
    with torch.no_grad():
        logits = model(torch.as_tensor(features))
    losses = per_sample_loss(logits, torch.as_tensor(labels)).double().numpy()
    correct = (predict(logits) == torch.as_tensor(labels)).numpy()

    for flags, rho in (([], 0.3), (["--rho", "0.5"], 0.5)):
        assert main(["evaluate", "--model", str(path), "--data", str(tmp_path / "held_out.csv"), "--json", *flags]) == 0
        reported = json.loads(capsys.readouterr().out)
        direct = group_risk_report(losses, correct, rho).to_dict()
        assert reported.pop("rows") == 200
        assert reported.keys() == direct.keys()
        for key, value in direct.items():
            assert reported[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key

    assert main(["evaluate", "--model", str(path), "--data", str(tmp_path / "held_out.csv")]) == 0
    text = capsys.readouterr().out
    assert "worst-group risk" in text and "accuracy" in text and "rho = 0.3" in text


def test_evaluate_without_labels_and_a_bundle_without_encoder_are_refused(
    tmp_path: Path, bundle_file: tuple[Path, nn.Module, Encoder, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, model, _, classes = bundle_file
    institution_table(20, classes, seed=5).drop(columns="income").to_csv(tmp_path / "unlabelled.csv", index=False)
    assert main(["evaluate", "--model", str(path), "--data", str(tmp_path / "unlabelled.csv")]) == 2
    assert "has no label column" in capsys.readouterr().err

    arrays_only = tmp_path / "arrays.bundle"
    write_bundle(
        arrays_only,
        Bundle(model.state_dict(), builtin_architecture("logreg", 3, 2), None, 0.0, {}, [], make_provenance(1, {})),
    )
    assert main(["predict", "--model", str(arrays_only), "--data", str(tmp_path / "unlabelled.csv"),
                 "--out", str(tmp_path / "p.csv")]) == 2  # fmt: skip
    assert "has no encoder" in capsys.readouterr().err
    assert not (tmp_path / "p.csv").exists()


def with_architecture(path: Path, architecture: dict[str, object], out: Path) -> Path:
    """A copy of the bundle at ``path`` whose architecture entry is ``architecture``."""
    bundle = load_bundle(path)
    write_bundle(out, dataclasses.replace(bundle, architecture=architecture))
    return out


@pytest.mark.parametrize(
    ("factory", "arguments"),
    [
        ("tests.bundle.test_commands:leave_marker", lambda marker: {"marker": str(marker)}),
        # What a hostile bundle would name: a shell command, run by importing os and calling system.
        ("os:system", lambda marker: {"command": f"touch '{marker}'"}),
    ],
    ids=["test-factory", "os-system"],
)
def test_predict_and_evaluate_refuse_a_factory_the_user_did_not_allow(
    tmp_path: Path,
    bundle_file: tuple[Path, nn.Module, Encoder, int],
    capsys: pytest.CaptureFixture[str],
    factory: str,
    arguments: Callable[[Path], dict[str, object]],
) -> None:
    path, _, _, classes = bundle_file
    marker = tmp_path / "factory-ran"
    hostile = with_architecture(path, factory_architecture(factory, arguments(marker)), tmp_path / "hostile.bundle")
    institution_table(30, classes, seed=5).to_csv(tmp_path / "rows.csv", index=False)
    data = ["--model", str(hostile), "--data", str(tmp_path / "rows.csv")]

    # Allowing another factory is no consent to this one.
    for command in (
        ["predict", *data, "--out", str(tmp_path / "p.csv")],
        ["evaluate", *data],
        ["predict", *data, "--out", str(tmp_path / "p.csv"), "--allow-factory", "tests.bundle.test_commands:linear"],
        ["evaluate", *data, "--allow-factory", "tests.bundle.test_commands:linear"],
    ):
        assert main(command) == 2
        assert not marker.exists(), f"{command} called the bundle's factory"
        error = capsys.readouterr().err
        assert f"builds its model with factory '{factory}'" in error and "it was not imported" in error
        assert f"run again with --allow-factory {factory}" in error
        assert "Traceback" not in error
    assert not (tmp_path / "p.csv").exists()


def test_predict_and_evaluate_build_an_allowed_factory_model(
    tmp_path: Path, bundle_file: tuple[Path, nn.Module, Encoder, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, model, encoder, classes = bundle_file
    # logreg is one nn.Linear, so the factory rebuilds the same model from the same weights.
    architecture = factory_architecture(
        "tests.bundle.test_commands:linear", {"features": encoder.num_features, "outputs": output_units(classes)}
    )
    own = with_architecture(path, architecture, tmp_path / "own.bundle")
    institution_table(120, classes, seed=9).to_csv(tmp_path / "rows.csv", index=False)
    data = ["--data", str(tmp_path / "rows.csv")]
    allow = ["--allow-factory", "torch.nn:Identity", "--allow-factory", "tests.bundle.test_commands:linear"]

    assert main(["predict", "--model", str(own), *data, "--out", str(tmp_path / "own.csv"), *allow]) == 0
    assert main(["predict", "--model", str(path), *data, "--out", str(tmp_path / "builtin.csv")]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "own.csv"), pd.read_csv(tmp_path / "builtin.csv"))
    capsys.readouterr()

    assert main(["evaluate", "--model", str(own), *data, "--json", *allow]) == 0
    from_factory = json.loads(capsys.readouterr().out)
    assert main(["evaluate", "--model", str(path), *data, "--json"]) == 0
    assert from_factory == json.loads(capsys.readouterr().out)


def test_predict_takes_a_category_the_federation_never_saw_as_none_of_its_categories(
    tmp_path: Path, bundle_file: tuple[Path, nn.Module, Encoder, int], caplog: pytest.LogCaptureFixture
) -> None:
    """A trained model predicts every row: an unseen category's one-hot block is 'no known level' (each
    level at its encoding of 0), the other rows are encoded as ever, and the warning names the values."""
    path, model, encoder, classes = bundle_file
    rows = institution_table(20, classes, seed=9).drop(columns="income")
    rows.loc[[3, 7], "sector"] = "military"
    rows.to_csv(tmp_path / "new.csv", index=False)
    command = ["predict", "--model", str(path), "--data", str(tmp_path / "new.csv"), "--out", str(tmp_path / "p.csv")]
    with caplog.at_level("WARNING", logger="fedfair.bundle"):
        assert main(command) == 0
    assert "column 'sector' holds categories the model was not trained on: 'military' (2 rows)" in caplog.text
    unseen: dict[str, dict[str, int]] = {}
    features, _ = encoder.encode(rows, "new rows", unseen=unseen)
    assert unseen == {"sector": {"military": 2}}
    known = rows.drop(index=[3, 7])
    np.testing.assert_array_equal(np.delete(features, [3, 7], axis=0), encoder.encode(known, "known rows")[0])
    (sector,) = [position for position, column in enumerate(encoder.schema.columns) if column.name == "sector"]
    start = sum(len(encoder.columns[position].means) for position in range(sector))
    encoding = encoder.columns[sector]
    block = features[3, start : start + len(encoding.means)]
    none_of_them = -np.array(encoding.means) / np.array(encoding.stds)
    np.testing.assert_allclose(block, none_of_them.astype(np.float32), rtol=0, atol=0)
    with pytest.raises(Exception, match="not among its \\[schema\\] categories"):
        encoder.encode(rows, "new rows")  # without `unseen` (training, evaluation) it is still refused
    assert len(pd.read_csv(tmp_path / "p.csv")) == 20
