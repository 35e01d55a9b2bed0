"""Atomic writes: readers see the old file or the whole new one, never half, and a failure leaves no temporary file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.files import atomic_write


class Interrupted(BaseException):
    """Stands in for KeyboardInterrupt or SystemExit without disturbing pytest."""


@settings(max_examples=30, deadline=None)
@given(old=st.binary(max_size=300), new=st.binary(max_size=300))
def test_a_successful_write_replaces_the_content_and_leaves_only_the_file(old: bytes, new: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "state.bin"
        path.write_bytes(old)
        atomic_write(path, lambda stream: stream.write(new))
        assert path.read_bytes() == new
        assert os.listdir(folder) == ["state.bin"]


def test_missing_parent_folders_are_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "state.json"
    atomic_write(path, lambda stream: stream.write(b"{}"))
    assert path.read_bytes() == b"{}"


def test_readers_see_the_old_content_while_the_new_one_is_being_written(tmp_path: Path) -> None:
    path = tmp_path / "state.bin"
    path.write_bytes(b"old version")
    seen: list[bytes] = []

    def write(stream: IO[bytes]) -> None:
        stream.write(b"new ")
        stream.flush()
        seen.append(path.read_bytes())
        stream.write(b"version")

    atomic_write(path, write)
    assert seen == [b"old version"] and path.read_bytes() == b"new version"


@pytest.mark.parametrize("failure", [OSError("disk full"), ValueError("not serialisable"), Interrupted()])
def test_a_failed_write_keeps_the_previous_file_and_removes_its_temporary(
    tmp_path: Path, failure: BaseException
) -> None:
    path = tmp_path / "state.bin"
    path.write_bytes(b"previous")

    def write(stream: IO[bytes]) -> None:
        stream.write(b"half of the new")
        raise failure

    with pytest.raises(type(failure)):
        atomic_write(path, write)
    assert path.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["state.bin"]


def test_a_failed_first_write_leaves_no_file_at_all(tmp_path: Path) -> None:
    def write(stream: IO[bytes]) -> None:
        stream.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(tmp_path / "state.bin", write)
    assert os.listdir(tmp_path) == []


def test_a_failed_rename_keeps_the_previous_file_and_removes_the_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.bin"
    path.write_bytes(b"previous")

    def refuse(source: str, target: str) -> None:
        raise PermissionError("rename refused")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError, match="rename refused"):
        atomic_write(path, lambda stream: stream.write(b"complete new content"))
    assert path.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["state.bin"]
