"""The accountant's state file is read within bounds: each odd value is one error naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.privacy.accounting import STATE_FORMAT, STATE_VERSION, PrivacyAccountant


def state(history: object) -> str:
    document = {"format": STATE_FORMAT, "version": STATE_VERSION, "data": {}, "rounds": {"f": 1}, "sha256": ""}
    return json.dumps(document).replace('"sha256"', f'"history": {history}, "sha256"')


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            state("[[1.0, 0.01, 1000000000000000000000000000000]]"),
            "field history[0][2] = 1000000000000000000000000000000",
        ),
        (state("[[1e999, 0.01, 10]]"), "field history[0][0] = 1e999 is out of range"),
        ("[" * 100_000 + "]" * 100_000, "nested 100000 levels deep"),
    ],
)
def test_an_odd_accountant_state_is_a_named_error(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "privacy.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        PrivacyAccountant(path, federation="f")
    assert str(refused.value).startswith(str(path)) and named in str(refused.value)
    assert "starting afresh would forget the privacy already spent" in str(refused.value)


def test_a_sound_accountant_state_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "privacy.json"
    PrivacyAccountant(path, federation="f").spend(1.1, 0.01, 30)
    assert PrivacyAccountant(path, federation="f").steps == 30
