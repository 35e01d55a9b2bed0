"""The records' .npz writer: what np.load reads back is every array bit for bit, however it was handed over."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.runtime.collaborator import archives


@dataclass(frozen=True)
class InSlices:
    """Values handed over `step` at a time, as a record's stored model or formed average is."""

    values: np.ndarray
    step: int

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.values.dtype

    @property
    def size(self) -> int:
        return self.values.size

    def slices(self) -> Iterator[np.ndarray]:
        return (self.values[start : start + self.step] for start in range(0, self.values.size, self.step))


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(0, 3000),
    step=st.integers(1, 700),
    dtype=st.sampled_from(["<f4", "<f8", "<u2", "<u8"]),
    slice_bytes=st.integers(1, 5000),
)
def test_written_arrays_read_back_bit_for_bit(size: int, step: int, dtype: str, slice_bytes: int) -> None:
    values = np.frombuffer(np.random.default_rng(size).bytes(size * np.dtype(dtype).itemsize), dtype=dtype)
    table = np.arange(6, dtype=np.int64).reshape(2, 3)
    stream = io.BytesIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(archives, "SLICE_BYTES", slice_bytes)  # the in-memory array's views, a few bytes at a time
        archives.write_archive(
            stream, {"whole": values, "sliced": InSlices(values, step), "weight": np.array(2.5), "table": table}
        )
    with np.load(io.BytesIO(stream.getvalue()), allow_pickle=False) as read:
        assert read["whole"].tobytes() == values.tobytes() and read["whole"].dtype == values.dtype
        assert read["sliced"].tobytes() == values.tobytes() and read["sliced"].dtype == values.dtype
        assert float(read["weight"]) == 2.5 and np.array_equal(read["table"], table)


@settings(max_examples=20, deadline=None)
@given(size=st.integers(0, 3000), dtype=st.sampled_from(["<f4", "<f8", "<u2"]), first=st.booleans())
def test_a_member_copied_as_it_stands_reads_back_bit_for_bit_with_its_checksum(
    tmp_path_factory: pytest.TempPathFactory, size: int, dtype: str, first: bool
) -> None:
    folder = tmp_path_factory.mktemp("archives")
    values = np.frombuffer(np.random.default_rng(size).bytes(size * np.dtype(dtype).itemsize), dtype=dtype)
    before, after = folder / "before.npz", folder / "after.npz"
    with open(before, "wb") as stream:
        archives.write_archive(stream, {"round": np.array(3), "model": values, "other": values[::-1].copy()})
    copied = {"model": archives.Member(before, "model"), "renamed": archives.Member(before, "other")}
    written = {"round": np.array(4), "new": values[: size // 2].copy()}
    with open(after, "wb") as stream:
        archives.write_archive(stream, {**copied, **written} if first else {**written, **copied})
    with zipfile.ZipFile(after) as archive:
        assert archive.testzip() is None  # every member's stated CRC-32 is its bytes'
    with np.load(after, allow_pickle=False) as read:
        assert sorted(read.files) == ["model", "new", "renamed", "round"]
        assert read["model"].dtype == values.dtype and read["model"].tobytes() == values.tobytes()
        assert read["renamed"].tobytes() == values[::-1].tobytes() and int(read["round"]) == 4
        assert read["new"].tobytes() == values[: size // 2].tobytes()


def test_a_compressed_member_is_not_copied_as_it_stands(tmp_path: Path) -> None:
    source = tmp_path / "compressed.npz"
    np.savez_compressed(source, model=np.arange(100.0))
    with pytest.raises(ValueError, match="model.npy is not a plain stored member"):
        archives.write_archive(io.BytesIO(), {"model": archives.Member(source, "model")})
