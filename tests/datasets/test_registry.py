"""Pinned hashes: bundled, cached and extracted data files are checked, and bad ones refused."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from fedfair.datasets import DATASETS, FetchError, fetch
from fedfair.datasets.registry import DataFile, extract_member, read_bundled, sha256_of


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
