"""The restricted unpicklers rebuild numpy arrays and refuse anything that would run code."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfair.datasets.safe_pickle import load_dataframe_pickle, load_numpy_pickle


class _RunsShellCommand:
    """A pickle payload that would run a shell command if the loader obeyed it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[[str], int], tuple[str]]:
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
