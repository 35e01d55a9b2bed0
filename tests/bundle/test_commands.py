"""`fedfair predict` and `fedfair evaluate` on a bundle of a small model trained here, with a real
schema encoder: predictions equal the in-process model's, row by row, and the evaluation equals
fedfair.fairness computed directly on the model's per-sample losses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from fedfair.bundle import Bundle, builtin_architecture, make_provenance, write_bundle
from fedfair.bundle.commands import PREDICTION_COLUMN, PROBABILITY_PREFIX
from fedfair.cli import main
from fedfair.core.models import build_model, per_sample_loss, predict
from fedfair.datasets.schema import (
    Encoder,
    draft_schema,
    encoder_from_statistics,
    statistics_vector,
)
from fedfair.fairness.pooled import group_risk_report

CLASSES = {2: ["<=50K", ">50K"], 3: ["high", "low", "mid"]}


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
