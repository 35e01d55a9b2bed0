"""`fedfair data list` and `fedfair data fetch`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fedfair.datasets import DATASETS
from fedfair.datasets.commands import register_commands


def test_data_commands_list_and_fetch(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="fedfair")
    register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", "list"])
    assert args.handler(args) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in DATASETS)
    assert "bundled" in listing and "CC BY 4.0" in listing
    args = parser.parse_args(["data", "fetch", "adult"])
    assert args.handler(args) == 0
    assert Path(capsys.readouterr().out.strip()).parts[-2:] == ("data", "adult")
