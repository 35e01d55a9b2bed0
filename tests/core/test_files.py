"""Atomic writes: readers see the old file or the whole new one, never half, and a failure leaves no temporary file.
Bounded JSON reads: every odd value is one named error, never a traceback."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import IO

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import json

from fedfair.core.errors import ConfigError
from fedfair.core.files import MAX_JSON_DEPTH, MAX_JSON_INTEGER, atomic_write, parse_json, read_json


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


def test_a_write_on_a_full_disk_names_the_file_it_was_writing(tmp_path: Path) -> None:
    """write(2) on a full disk raises ENOSPC with no file name; the error that leaves atomic_write names the
    file it was writing, so that the operator learns which disk filled."""
    path = tmp_path / "state.bin"
    path.write_bytes(b"previous")

    def write(stream: IO[bytes]) -> None:
        stream.write(b"half of the new")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as the system raises it

    with pytest.raises(OSError) as raised:
        atomic_write(path, write)
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(path))
    assert path.read_bytes() == b"previous" and os.listdir(tmp_path) == ["state.bin"]


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


FIX = "restore it from a backup"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (b'{"format": "x", "latest": 1e999}', "field latest = 1e999 is out of range"),
        (
            b'{"history": [[1.0, 0.01, 1000000000000000000000000000000]]}',
            "field history[0][2] = 1000000000000000000000000000000",
        ),
        (b'{"a": {"b": [NaN]}}', "field a.b[0] = NaN is out of range"),
        (b'{"a": -Infinity}', "field a = -Infinity"),
        (b"[" * 100_000 + b"]" * 100_000, "nested 100000 levels deep, above the limit of 32"),
        (b"1" + b"0" * 400, "field (the whole file) = 10000000000000000000... is out of range"),
        (b'{"a": 1', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_an_odd_value_in_a_state_file_is_one_named_error(tmp_path: Path, text: bytes, named: str) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as refused:
        read_json(path, FIX)
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and named in message and message.endswith(FIX)
    assert len(message) < 400  # one line the operator can read, not the 400 digits back


def test_the_bounds_admit_what_fedfair_writes_and_stop_just_past_them() -> None:
    document = {"latest": 7, "history": [[1.1, 0.01, 2**53]], "names": ["[[[[", "{{"], "x": -2.5e-300}
    assert parse_json(json.dumps(document).encode(), "s", FIX) == document
    deep = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert parse_json(deep, "s", FIX) is not None
    with pytest.raises(ConfigError, match="nested 33 levels"):
        parse_json(b"[" + deep + b"]", "s", FIX)
    with pytest.raises(ConfigError, match="out of range"):
        parse_json(str(-(MAX_JSON_INTEGER + 1)).encode(), "s", FIX)


def test_a_state_file_past_the_size_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b" " * 2048 + b"{}")
    with pytest.raises(ConfigError, match="2050 bytes, above the 2048-byte limit"):
        read_json(path, FIX, max_bytes=2048)
    with pytest.raises(ConfigError, match="unreadable"):
        read_json(tmp_path / "missing.json", FIX)
