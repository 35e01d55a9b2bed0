"""Fixtures shared by the runtime tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.runtime.harness import Processes


@pytest.fixture()
def processes() -> Iterator[Processes]:
    """Child processes of one test, all killed when it ends."""
    group = Processes()
    yield group
    for child in group.children:
        child.kill()
