"""``fedfair aggregator start``: a bad flag is blamed on the flag, and the log goes where it is told."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedfair.cli import main as cli_main
from fedfair.runtime.logs import configure_logging
from tests.runtime.harness import new_workspace


@pytest.fixture(autouse=True)
def root_logger() -> Iterator[logging.Logger]:
    """The root logger as it was: `aggregator start` configures logging onto this test's captured stderr,
    which later tests' threads must not write to once it is closed."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rounds", "-3"], "fedfair: error: --rounds must be an integer >= 1, got -3; fix the flag\n"),
        (
            ["--address", "notanaddress"],
            (
                'fedfair: error: --address must be host:port with a port in 1..65535, e.g. "localhost:50051", '
                'got "notanaddress"; fix the flag\n'
            ),
        ),
    ],
)
def test_a_bad_flag_is_blamed_on_the_flag_not_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    workspace = new_workspace(tmp_path, ["site-a", "site-b"])
    assert cli_main(["aggregator", "start", "--plan", str(workspace.plan), *flags]) == 2
    assert capsys.readouterr().err == message


def test_a_negative_startup_timeout_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["aggregator", "start", "--startup-timeout", "-1"])
    assert "argument --startup-timeout: must be a number of seconds >= 0 (0: no deadline), got '-1'" in (
        capsys.readouterr().err
    )


def test_log_level_and_log_file(tmp_path: Path, root_logger: logging.Logger) -> None:
    log_file = tmp_path / "logs" / "aggregator.log"
    configure_logging("warning", log_file)
    logging.getLogger("fedfair.aggregator").info("quiet")
    logging.getLogger("fedfair.aggregator").warning("loud")
    for handler in root_logger.handlers:
        handler.flush()
    text = log_file.read_text()
    assert "WARNING loud" in text and "quiet" not in text
