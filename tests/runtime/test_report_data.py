"""What `fedfair report` reads of an output folder: the records as data, and each round's cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.runtime.report.data import Run, contribution_matrix, read_json_lines, roster, stage_label


def test_a_line_that_is_no_json_object_is_named_with_its_file_line_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "rounds.jsonl"
    path.write_text('{"round": 1}\n\n[1, 2]\n')
    with pytest.raises(ConfigError, match=r"rounds.jsonl line 3 is not a round record \(not a JSON object\); restore"):
        read_json_lines(path, "a round record", "restore it")
    path.write_text('{"round": 1}\n\n{"round": 2}\n')
    assert read_json_lines(path, "a round record", "restore it") == [{"round": 1}, {"round": 2}]


def test_each_round_marks_who_contributed_dropped_was_excluded_and_stays_out_until_readmitted() -> None:
    applied = {"status": "applied", "participants": ["a", "b", "c"], "contributors": ["a", "b"]}
    rounds = [
        {**applied, "round": 1, "dropped": {"STAGE_MASKED_INPUT": ["c"], "STAGE_UNMASK": ["b"]}},
        {**applied, "round": 2, "participants": ["a", "b"], "excluded": {"b": "a bad share"}},
        {**applied, "round": 3, "participants": ["a"], "contributors": ["a"]},
        {**applied, "round": 4, "readmitted": ["b"], "participants": ["a"], "contributors": ["a"]},
        {**applied, "round": 5, "participants": ["a"], "contributors": ["a"]},
    ]
    run = Run(Path("out"), rounds, [{"event": "start", "collaborators": ["a", "b", "c"]}])
    names = roster(run)
    assert names == ["a", "b", "c"]
    states = [{name: cell.state for name, cell in cells.items()} for _, cells in contribution_matrix(run, names)]
    assert states == [
        {"a": "contributed", "b": "late", "c": "dropped"},
        {"a": "contributed", "b": "excluded", "c": "absent"},
        {"a": "contributed", "b": "out", "c": "absent"},
        {"a": "contributed", "b": "out", "c": "absent"},  # re-admitted by this record: out from the next one on
        {"a": "contributed", "b": "absent", "c": "absent"},
    ]
    assert stage_label("STAGE_MASKED_INPUT") == "upload"
    assert stage_label("STAGE_ADVERTISE_KEYS") == "key exchange"
    assert stage_label("STAGE_EVAL_UNMASK") == "evaluation: unmasking the sum"
