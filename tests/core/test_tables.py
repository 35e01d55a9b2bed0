"""Checked tables: a number too large for a float is the same named error as any other bad value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, load_shared_settings, shared_settings
from fedfair.core.tables import SHOWN_CHARACTERS, Table, read_toml, shown
from tests.runtime.harness import new_workspace


@pytest.mark.parametrize("value", [10**399, -(10**399), 10**5000], ids=["400 digits", "-400 digits", "5001 digits"])
def test_an_integer_past_a_float_is_refused_by_name_not_by_overflow(value: int) -> None:
    table = Table("plan.toml", "quorum", {"round_timeout_seconds": value}, ("round_timeout_seconds",))
    with pytest.raises(
        ConfigError, match=r"plan.toml: \[quorum\] round_timeout_seconds must be a number of seconds"
    ) as refused:
        table.number("round_timeout_seconds", check=lambda x: x > 0, expected="a number of seconds > 0")
    assert len(str(refused.value)) < SHOWN_CHARACTERS + 150


def test_a_400_digit_integer_in_a_served_plan_names_the_field(tmp_path: Path) -> None:
    """What the collaborator reads as the aggregator's plan: a ConfigError, which it reports as plan-mismatch."""
    plan = load_aggregator_plan(new_workspace(tmp_path, ["site-a", "site-b", "site-c"]).plan)
    served = json.loads(shared_settings(plan))
    served["quorum"]["round_timeout_seconds"] = 10**399
    with pytest.raises(ConfigError, match=r"\[quorum\] round_timeout_seconds must be"):
        load_shared_settings(json.dumps(served).encode())


@pytest.mark.parametrize(
    "payload",
    [b"[" * 100_000 + b"]" * 100_000, b'{"quorum": ' + b"1" * 5000 + b"}"],
    ids=["100,000 deep", "5,000 digits"],
)
def test_a_served_plan_too_deep_or_too_long_a_number_is_a_named_error(payload: bytes) -> None:
    with pytest.raises(ConfigError, match="the aggregator's plan: not valid JSON"):
        load_shared_settings(payload)


def test_every_refused_key_names_the_file_the_section_the_key_and_the_nearest_known_one() -> None:
    with pytest.raises(ConfigError, match=r"^plan.toml: \[training\] unknown key 'roundz'; did you mean 'rounds'\?$"):
        Table("plan.toml", "training", {"roundz": 3}, ("rounds", "lr"))
    with pytest.raises(ConfigError, match=r"^plan.toml: \[training\] missing key 'rounds'; add rounds = <an integer>$"):
        Table("plan.toml", "training", {}, ("rounds",)).integer("rounds")
    # Every reader, the JSON table's too, refuses a missing key by name (it was a KeyError).
    with pytest.raises(ConfigError, match=r"^plan.toml: \[model\] missing key 'arguments'; add arguments = <a table"):
        Table("plan.toml", "model", {}, ("arguments",)).json_table("arguments")


def test_an_array_of_tables_names_each_entry_by_its_header_and_position() -> None:
    schema = Table("plan.toml", "schema", {"columns": [{"name": "a"}, {"nmae": "b"}]}, ("columns",))
    with pytest.raises(
        ConfigError, match=r"^plan.toml: \[\[schema.columns\]\] #2 unknown key 'nmae'; did you mean 'name'\?$"
    ):
        schema.entries("columns", ("name",))
    with pytest.raises(ConfigError, match=r"^plan.toml: \[\[schema.columns\]\] #1 must be a table .*, got 3$"):
        Table("plan.toml", "schema", {"columns": [3]}, ("columns",)).entries("columns", ("name",))
    for empty in ({}, {"columns": []}):
        with pytest.raises(
            ConfigError, match=r"\[schema\] needs a non-empty list of columns.*; add \[\[schema.columns\]\]"
        ):
            Table("plan.toml", "schema", empty, ("columns",)).entries("columns", ("name",))


def test_a_value_is_shown_exactly_in_any_script_with_invisible_characters_escaped() -> None:
    assert shown(["São Paulo", "Zürich", "東京"]) == '["São Paulo", "Zürich", "東京"]'
    assert shown("a\x1bb\x9bc\u202ed") == '"a\\u001bb\\u009bc\\u202ed"'  # ESC, CSI and a right-to-left override
    long = "x" * 1000
    assert shown(long).endswith("... (1002 characters)") and len(shown(long)) < SHOWN_CHARACTERS + 30


def test_a_toml_file_is_read_as_written_and_each_unreadable_file_is_named_with_its_fix(tmp_path: Path) -> None:
    crlf = tmp_path / "crlf.toml"
    crlf.write_bytes(b'[note]\r\ntext = """\r\nline one\r\nline two"""\r\nlabel = "S\xc3\xa3o Paulo"\r\n')
    path, data = read_toml(crlf)
    # Read as UTF-8 whatever the locale; tomllib reads a CRLF file's multi-line string with plain newlines.
    assert path == crlf.resolve() and data == {"note": {"text": "line one\nline two", "label": "São Paulo"}}
    with pytest.raises(ConfigError, match=r"missing.toml not found; copy the template next to it and edit it$"):
        read_toml(tmp_path / "missing.toml")
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'label = "S\xe3o Paulo"\n')
    with pytest.raises(ConfigError, match=r"latin.toml: cannot read it as TOML \(.*utf-8.*\); give a TOML file$"):
        read_toml(latin)
    broken = tmp_path / "broken.toml"
    broken.write_text("[training\nrounds = 3\n")
    with pytest.raises(ConfigError, match=r"broken.toml: not valid TOML \(.*\); fix the syntax$"):
        read_toml(broken)
