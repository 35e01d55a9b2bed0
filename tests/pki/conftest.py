"""The PKI tests' shared fixture: a folder with a fresh CA."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.pki import store


@pytest.fixture()
def ca_dir(tmp_path: Path) -> Path:
    """A certificates folder holding ca.crt and ca.key."""
    directory = tmp_path / "ca"
    store.init_ca(directory)
    return directory
