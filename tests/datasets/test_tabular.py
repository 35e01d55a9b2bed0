"""An institution's own CSV or Parquet table: encoded, split within each site, problems explained."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfair.core.errors import ConfigError
from fedfair.datasets import load_csv, partition
from tests.datasets.helpers import assert_exact_cover


@pytest.fixture
def clinic_table() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = 400
    return pd.DataFrame(
        {
            "site": rng.choice(["north", "south", "east"], size=n, p=[0.5, 0.3, 0.2]),
            "age": rng.integers(18, 90, size=n),
            "smoker": rng.choice(["yes", "no", None], size=n),
            "blood_pressure": rng.normal(120, 15, size=n),
            "notes": [f"visit {i}" for i in range(n)],
            "patient_id": np.arange(n),
            "outcome": rng.choice(["recovered", "readmitted"], size=n),
        }
    )


def test_load_csv_encodes_a_table_and_splits_within_each_site(tmp_path: Path, clinic_table: pd.DataFrame) -> None:
    path = tmp_path / "clinic.csv"
    clinic_table.to_csv(path, index=False)
    features = ["site", "age", "smoker", "blood_pressure"]
    dataset = load_csv(path, label="outcome", split_by="site", features=features)
    assert dataset.name == "clinic"
    assert dataset.class_names == ["readmitted", "recovered"]
    assert len(dataset.y_train) + len(dataset.y_test) == 400
    assert 0.2 < len(dataset.y_test) / 400 < 0.3
    assert dataset.feature_names == [
        "site=east", "site=north", "site=south", "age", "smoker=no", "smoker=yes", "smoker=missing", "blood_pressure",
    ]  # fmt: skip
    assert np.abs(dataset.x_train.mean(axis=0)).max() < 1e-5
    clients = partition(dataset, "site", 3)
    assert [client.name for client in clients] == ["north", "south", "east"]
    assert all(len(client.test_index) > 0 for client in clients)
    assert_exact_cover(dataset, clients)
    again = load_csv(path, label="outcome", split_by="site", features=features)
    assert np.array_equal(dataset.x_test, again.x_test)


def test_load_csv_reads_parquet_the_same_way(tmp_path: Path, clinic_table: pd.DataFrame) -> None:
    clinic_table.to_csv(tmp_path / "clinic.csv", index=False)
    clinic_table.to_parquet(tmp_path / "clinic.parquet")
    kwargs = {"label": "outcome", "split_by": "site", "features": ["age", "smoker", "blood_pressure"]}
    from_csv = load_csv(tmp_path / "clinic.csv", **kwargs)
    from_parquet = load_csv(tmp_path / "clinic.parquet", **kwargs)
    assert from_csv.feature_names == from_parquet.feature_names
    assert np.allclose(from_csv.x_train, from_parquet.x_train)
    assert np.array_equal(from_csv.y_test, from_parquet.y_test)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"label": "income"}, (r"column 'income' not found in clinic.csv; pass --label with one of: site, age, smoker, "
                               r"blood_pressure, notes, patient_id, outcome")),
        ({"label": "blood_pressure"}, (r"label column 'blood_pressure' in clinic.csv is continuous \(400 distinct "
                                       r"decimal values\); pass a categorical column, or binarise it first")),
        ({"label": "patient_id"}, r"label column 'patient_id' in clinic.csv has 400 distinct values"),
        ({"label": "outcome"}, (r"column 'notes' in clinic.csv has 400 distinct text values, too many to one-hot "
                                r"encode \(limit 100\); drop it by passing --features without it")),
        ({"label": "outcome", "split_by": "hospital"}, (r"split-by column 'hospital' not found in clinic.csv; "
                                                        r"pass --split-by with one of: site, age")),
        ({"label": "outcome", "features": ["age", "weight"]}, r"feature column 'weight' not found in clinic.csv"),
        ({"label": "outcome", "features": ["age", "outcome"]}, r"label 'outcome' cannot also be a feature"),
        ({"label": "outcome", "features": ["age"], "test_fraction": 1.0}, r"test fraction must be between 0 and 1"),
    ],
)  # fmt: skip
def test_load_csv_explains_each_problem_in_one_line(
    tmp_path: Path, clinic_table: pd.DataFrame, kwargs: dict, message: str
) -> None:
    path = tmp_path / "clinic.csv"
    clinic_table.to_csv(path, index=False)
    with pytest.raises(ConfigError, match=message) as raised:
        load_csv(path, **kwargs)
    assert "\n" not in str(raised.value)


def test_load_csv_explains_a_missing_file_and_a_one_class_label(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data file .*nowhere.csv not found; check the path"):
        load_csv(tmp_path / "nowhere.csv", label="y")
    pd.DataFrame({"x": [1, 2, 3, 4], "y": ["a", "a", "a", "a"]}).to_csv(tmp_path / "flat.csv", index=False)
    with pytest.raises(ConfigError, match=r"label column 'y' in flat.csv has only the value 'a'"):
        load_csv(tmp_path / "flat.csv", label="y")
    (tmp_path / "table.xlsx").write_bytes(b"PK")
    with pytest.raises(ConfigError, match=r"table.xlsx is neither CSV .* nor Parquet"):
        load_csv(tmp_path / "table.xlsx", label="y")


def test_load_csv_refuses_a_header_only_table(tmp_path: Path) -> None:
    (tmp_path / "empty.csv").write_text("age,outcome\n")
    with pytest.raises(ConfigError, match=r"^empty.csv has no data rows \(only a header\); add the data rows"):
        load_csv(tmp_path / "empty.csv", label="outcome")


def test_load_csv_says_what_it_imputes_and_which_label_is_positive(
    tmp_path: Path, clinic_table: pd.DataFrame, caplog: pytest.LogCaptureFixture
) -> None:
    clinic_table.loc[:6, "blood_pressure"] = np.nan
    clinic_table.to_csv(tmp_path / "clinic.csv", index=False)
    with caplog.at_level(logging.WARNING, logger="fedfair.datasets"):
        load_csv(tmp_path / "clinic.csv", label="outcome", features=["age", "smoker", "blood_pressure"])
    positive = (
        "label 'outcome' in clinic.csv: 'recovered' is the positive class (1) and 'readmitted' the negative class (0), "
        "in sorted order"
    )
    imputed = (
        "column 'blood_pressure' in clinic.csv has 7 missing values; each is replaced by the training mean "
        "(fill them in, or leave the column out with --features)"
    )
    assert [record.getMessage() for record in caplog.records] == [positive, imputed]
