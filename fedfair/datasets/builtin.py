"""Parsing the four built-in datasets into Datasets, with a parsed-array cache for the fetched ones."""

from __future__ import annotations

import gzip
import io
import lzma
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from fedfair.datasets.dataset import Dataset
from fedfair.datasets.registry import (
    DatasetInfo,
    dataset_dir,
    dataset_info,
    fetch,
    read_bundled,
)
from fedfair.datasets.safe_pickle import load_dataframe_pickle, load_numpy_pickle
from fedfair.datasets.tabular import as_strings, encode_features, split_rows

# Part of the parsed-array cache's file name: bump it whenever a loader's output
# changes, so caches written by older code are not reused.
ENCODING_VERSION = 2
# The cache's file name of an attribute column: attributes_SPLIT.COLUMN.npy.
ATTRIBUTES_PREFIX = "attributes_"

ADULT_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
    "income",
]  # fmt: skip
ADULT_CATEGORICAL = [
    "workclass", "education", "marital-status", "occupation", "relationship", "race", "sex", "native-country",
]  # fmt: skip

# Census-Income (KDD) columns in file order, named after the UCI census-income.names description.
CENSUS_COLUMNS = [
    "age", "class_of_worker", "industry_code", "occupation_code", "education", "wage_per_hour",
    "enrolled_in_school_last_week", "marital_status", "major_industry", "major_occupation", "race",
    "hispanic_origin", "sex", "labor_union_member", "unemployment_reason", "employment_status",
    "capital_gains", "capital_losses", "stock_dividends", "tax_filer_status", "previous_region",
    "previous_state", "household_detail", "household_summary", "instance_weight", "migration_msa",
    "migration_region", "migration_within_region", "same_house_1_year_ago", "migration_sunbelt",
    "persons_worked_for_employer", "family_members_under_18", "father_birth_country",
    "mother_birth_country", "birth_country", "citizenship", "self_employed", "veterans_questionnaire",
    "veterans_benefits", "weeks_worked", "year", "income",
]  # fmt: skip
CENSUS_NUMERIC = [
    "age", "wage_per_hour", "capital_gains", "capital_losses", "stock_dividends",
    "persons_worked_for_employer", "weeks_worked",
]  # fmt: skip
# instance_weight is the survey's sampling weight, not a property of the person.
CENSUS_DROPPED = ["instance_weight", "income"]

# The selection-equation covariates of Cameron & Trivedi (2005, section 16.6) for "any
# medical expense"; the utilisation and expense columns are excluded because they
# determine the label, and person id / plan number because they identify, not describe.
RAND_HIE_FEATURES = [
    "logc", "idp", "lpi", "fmde", "physlm", "disea", "hlthg", "hlthf", "hlthp", "linc", "lfam",
    "educdec", "xage", "female", "child", "fchild", "black",
]  # fmt: skip
# RAND HIE has no published split: a fixed quarter of the people (not person-years, so no
# one is in both splits), drawn within each site, is the test split.
RAND_HIE_TEST_FRACTION = 0.25
RAND_HIE_SPLIT_SEED = 0


def load_dataset(name: str, *, cache_dir: Path | None = None) -> Dataset:
    """Load a built-in dataset by name: "adult", "census-income", "mnist" or "rand-hie".

    Adult is parsed from the bundled files (well under a second). The others are
    fetched once into the cache (see ``fetch``), parsed, and their arrays saved next
    to the files (a folder of .npy files) so later loads only map them back.

    A dataset read back from that cache is memory-mapped copy-on-write: its arrays
    behave as private writable arrays, but only the pages a process touches are read,
    and the pages no process has written are one copy in the page cache shared by every
    process on the machine. A collaborator that takes its own rows of Census-Income
    (650 MB of arrays) thus holds only those rows, however many sites run beside it.
    """
    info = dataset_info(name)
    if info.bundled:
        return _load_adult(info)
    cached = dataset_dir(info, cache_dir) / f"{name}-arrays-v{ENCODING_VERSION}"
    if cached.is_dir():
        try:
            return _read_arrays(name, cached)
        except (OSError, ValueError, KeyError):
            # A stale or damaged cache: it is derived data, so remove it and rebuild it below.
            shutil.rmtree(cached, ignore_errors=True)
    dataset = _PARSERS[name](fetch(name, cache_dir), info)
    for version in range(1, ENCODING_VERSION):  # arrays older loaders wrote are never read again
        shutil.rmtree(cached.with_name(f"{name}-arrays-v{version}"), ignore_errors=True)
    try:
        _write_arrays(dataset, cached)
    except OSError as error:
        # A read-only shared cache still serves the verified files; only the speed-up is lost.
        warnings.warn(f"could not save parsed arrays to {cached} ({error}); later loads will parse again", stacklevel=2)
    return dataset


def adult_table(info: DatasetInfo, part: int = 0) -> pd.DataFrame:
    """Adult's bundled adult.data (`part` 0) or adult.test (1) as raw text and numbers, "?" as a gap.

    What an institution's own export of it would read; the built-in dataset's rows, in order.
    """
    # adult.test starts with "|1x3 Cross validator".
    return pd.read_csv(
        io.BytesIO(read_bundled(info, info.files[part])),
        header=None,
        names=ADULT_COLUMNS,
        skiprows=part,
        skipinitialspace=True,
        na_values=["?"],
        keep_default_na=False,
    )


def _load_adult(info: DatasetInfo) -> Dataset:
    """UCI Adult with its published split; "?" (unknown) is kept as the category "missing"."""
    train, test = adult_table(info, 0), adult_table(info, 1)
    features = [name for name in ADULT_COLUMNS if name not in ("fnlwgt", "income")]
    return _income_dataset(info, train, test, features, ADULT_CATEGORICAL, ["race", "sex", "native-country"])


def _income_dataset(
    info: DatasetInfo,
    train: pd.DataFrame,
    test: pd.DataFrame,
    features: list[str],
    categorical: list[str],
    attributes: list[str],
) -> Dataset:
    """A census table with an income column as a binary task: income above 50K (both datasets' label)."""
    x_train, x_test, feature_names = encode_features(train[features], test[features], categorical)
    return Dataset(
        name=info.name,
        x_train=x_train,
        y_train=_income_above_50k(train["income"]),
        x_test=x_test,
        y_test=_income_above_50k(test["income"]),
        num_classes=2,
        feature_names=feature_names,
        class_names=["<=50K", ">50K"],
        attributes_train=_attributes(train, attributes),
        attributes_test=_attributes(test, attributes),
    )


def _income_above_50k(income: pd.Series) -> np.ndarray:
    # adult.test spells the labels ">50K." and "<=50K."; census-income uses "50000+." / "- 50000.".
    above: np.ndarray = income.str.rstrip(".").isin([">50K", "50000+"]).to_numpy(dtype=np.int64)
    return above


def _attributes(table: pd.DataFrame, columns: list[str]) -> dict[str, np.ndarray]:
    return {name: as_strings(table[name]) for name in columns}


def _parse_census_income(folder: Path, info: DatasetInfo) -> Dataset:
    """Census-Income (KDD) with its published split; "?" is kept as the category "missing"."""
    train, test = (
        pd.read_csv(
            folder / data_file.filename,
            header=None,
            names=CENSUS_COLUMNS,
            skipinitialspace=True,
            na_values=["?"],
            keep_default_na=False,
        )
        for data_file in info.files
    )
    features = [name for name in CENSUS_COLUMNS if name not in CENSUS_DROPPED]
    categorical = [name for name in features if name not in CENSUS_NUMERIC]
    # previous_state is the only state-level geography in the extract: the state lived in a year
    # earlier, "Not in universe" for the 92% who had not moved (data/README.md, the 51-site split).
    return _income_dataset(info, train, test, features, categorical, ["race", "sex", "previous_state"])


def _parse_mnist(folder: Path, info: DatasetInfo) -> Dataset:
    """MNIST: the pickle's train and validation parts together form the usual 60,000-image training set.

    Pixels arrive already scaled to [0, 1) (grey level / 256); they are then standardised
    with one mean and one standard deviation over all training pixels (per-pixel
    statistics would blow up the near-constant border pixels).
    """
    content = gzip.decompress((folder / info.files[0].filename).read_bytes())
    (x_train, y_train), (x_valid, y_valid), (x_test, y_test) = load_numpy_pickle(content)
    x_train = np.concatenate([x_train, x_valid]).astype(np.float32)
    y_train = np.concatenate([y_train, y_valid]).astype(np.int64)
    x_test = np.asarray(x_test, dtype=np.float32)
    mean, std = x_train.mean(dtype=np.float64), x_train.std(dtype=np.float64)
    for x in (x_train, x_test):
        x -= np.float32(mean)
        x /= np.float32(std)
    return Dataset(
        name=info.name,
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=np.asarray(y_test, dtype=np.int64),
        num_classes=10,
        feature_names=[f"pixel_{row}_{col}" for row in range(28) for col in range(28)],
        class_names=[str(digit) for digit in range(10)],
        attributes_train={},
        attributes_test={},
        image_shape=(1, 28, 28),
    )


def _parse_rand_hie(folder: Path, info: DatasetInfo) -> Dataset:
    """RAND HIE person-years; label 1 if the year had any covered medical expense (``binexp``).

    The 4 person-years without the household head's education are dropped, as in
    Cameron & Trivedi. Sites are coded 1-6 in this copy (the six HIE towns, unnamed).
    """
    columns = load_dataframe_pickle(lzma.decompress((folder / info.files[0].filename).read_bytes()))
    table = pd.DataFrame(columns)
    table = table[table["educdec"].notna()].reset_index(drop=True)
    site = np.array([f"site {int(code)}" for code in table["site"]])
    person = table["zper"].to_numpy()
    people, first_row = np.unique(person, return_index=True)
    _, test_people = split_rows(site[first_row], RAND_HIE_TEST_FRACTION, RAND_HIE_SPLIT_SEED)
    is_test = np.isin(person, people[test_people])
    train_rows, test_rows = np.flatnonzero(~is_test), np.flatnonzero(is_test)
    x_train, x_test, feature_names = encode_features(
        table[RAND_HIE_FEATURES].iloc[train_rows], table[RAND_HIE_FEATURES].iloc[test_rows], categorical=[]
    )
    label = table["binexp"].to_numpy(dtype=np.int64)
    sex = np.where(table["female"].to_numpy() == 1, "female", "male")
    return Dataset(
        name=info.name,
        x_train=x_train,
        y_train=label[train_rows],
        x_test=x_test,
        y_test=label[test_rows],
        num_classes=2,
        feature_names=feature_names,
        class_names=["no expense", "any expense"],
        attributes_train={"site": site[train_rows], "sex": sex[train_rows]},
        attributes_test={"site": site[test_rows], "sex": sex[test_rows]},
    )


_PARSERS: dict[str, Callable[[Path, DatasetInfo], Dataset]] = {
    "census-income": _parse_census_income,
    "mnist": _parse_mnist,
    "rand-hie": _parse_rand_hie,
}


def _write_arrays(dataset: Dataset, folder: Path) -> None:
    """Save a Dataset as a folder of .npy files (plain arrays, no pickles), atomically.

    The folder appears under its name only when whole, and a concurrent writer that got there first wins.
    """
    arrays = {
        "x_train": dataset.x_train,
        "y_train": dataset.y_train,
        "x_test": dataset.x_test,
        "y_test": dataset.y_test,
        "feature_names": np.array(dataset.feature_names, dtype=str),
        "class_names": np.array(dataset.class_names, dtype=str),
        "image_shape": np.array(dataset.image_shape or (), dtype=np.int64),
    }
    for split, attributes in (("train", dataset.attributes_train), ("test", dataset.attributes_test)):
        for key, values in attributes.items():
            arrays[f"{ATTRIBUTES_PREFIX}{split}.{key}"] = values
    partial = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    partial.mkdir()
    try:
        for key, values in arrays.items():
            np.save(partial / f"{key}.npy", values, allow_pickle=False)
        try:
            os.rename(partial, folder)
        except OSError:
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    # The single-file cache of earlier versions (all arrays read whole by every process) is superseded.
    folder.with_name(f"{folder.name}.npz").unlink(missing_ok=True)


def _read_arrays(name: str, folder: Path) -> Dataset:
    """The Dataset saved in `folder`, every array memory-mapped copy-on-write (see ``load_dataset``)."""
    arrays = {path.stem: np.asarray(np.load(path, mmap_mode="c", allow_pickle=False)) for path in folder.glob("*.npy")}
    attributes: dict[str, dict[str, np.ndarray]] = {"train": {}, "test": {}}
    for key, values in arrays.items():
        if key.startswith(ATTRIBUTES_PREFIX):
            split, attribute = key.removeprefix(ATTRIBUTES_PREFIX).split(".", 1)
            attributes[split][attribute] = values
    class_names = arrays["class_names"].tolist()
    return Dataset(
        name=name,
        x_train=arrays["x_train"],
        y_train=arrays["y_train"],
        x_test=arrays["x_test"],
        y_test=arrays["y_test"],
        num_classes=len(class_names),
        feature_names=arrays["feature_names"].tolist(),
        class_names=class_names,
        attributes_train=attributes["train"],
        attributes_test=attributes["test"],
        image_shape=tuple(int(size) for size in arrays["image_shape"]) or None,
    )
