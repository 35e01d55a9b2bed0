"""The runtime's console: per-round lines become one progress bar (with the latest risks), every other
line stays, warnings always show, ``verbose`` prints everything; the log file gets every line."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedfair.runtime.observe.logs import LOG_FORMAT, Console, configure_logging, per_round, quiet_grpc
from fedfair.runtime.report import verdicts

EVALUATIONS = {
    True: {"worst_risk": 0.75, "mean_risk": 0.5},
    False: {
        "worst_risk": 0.25,
        "worst_risk_low": 0.21,
        "worst_risk_high": 0.29,
        "mean_risk": 0.125,
        "mean_error_bound": 0.02,
        "noise_std": 1.0,
        "loss_cap": 3.0,
    },
}
"""An exact evaluation (mid-run) and a noised one (the final), by whether the round is before the last."""


@pytest.fixture()
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger("fedfair.test-console")
    log.propagate, log.level = False, logging.DEBUG
    yield log
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()


def console_of(log: logging.Logger, *, verbose: bool = False) -> io.StringIO:
    stream = io.StringIO()
    handler = Console("aggregator", stream, verbose=verbose)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.addHandler(handler)
    return stream


def run_rounds(log: logging.Logger, rounds: int = 10) -> None:
    log.info("site-a connected")
    for number in range(1, rounds + 1):
        if number == 4:
            log.warning("round %d aborted, model unchanged: too few", number, extra=per_round(number, rounds))
        else:
            log.info("round %d applied", number, extra=per_round(number, rounds))
        if number % 5 == 0:
            # The final evaluation is noised: its figures come with their 95% intervals.
            extra = per_round(
                number, rounds, note=verdicts.progress_note(EVALUATIONS[number < rounds] | {"round": number})
            )
            log.info("round %d evaluation", number, extra=extra)
    log.info("finished: 9 of 10 rounds applied, 1 aborted")


def test_the_console_shows_progress_warnings_and_other_lines_but_no_per_round_info(logger: logging.Logger) -> None:
    stream = console_of(logger)
    run_rounds(logger)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "INFO site-a connected" and lines[-1] == "INFO finished: 9 of 10 rounds applied, 1 aborted"
    assert not any(line.startswith("INFO round") for line in lines)
    assert "WARNING round 4 aborted, model unchanged: too few" in lines
    # A piped console gets a progress line per tenth of the run; after round 5 it carries the risks, and
    # the last line waits for the last round's evaluation (logged after the round): one 100% line, the result's.
    progress = [line for line in lines if line.startswith("aggregator: ")]
    assert len(progress) == 10 and sum("10/10 rounds (100%)" in line for line in progress) == 1
    assert max(len(line) for line in progress) <= 120  # a longer one says less (progress.fitted)
    # The round 5 figures stay beside the bar until the next evaluation, naming the round they are from.
    exact = "worst-group risk 0.7500 (exact sums: 0.7500 to 0.7500, round 5), mean 0.5000"
    assert progress[5].endswith(exact) and progress[8].endswith(exact) and "worst" not in progress[3]
    assert progress[-1].startswith("aggregator: 10/10 rounds (100%), done in ")
    # The whole result would take it to 126 characters: it says the worst-group risk, the closing line the rest.
    assert progress[-1].endswith(", worst-group risk 0.25 (95% interval 0.21 to 0.29, round 10)")


def test_verbose_prints_every_line(logger: logging.Logger) -> None:
    stream = console_of(logger, verbose=True)
    run_rounds(logger)
    text = stream.getvalue()
    assert all(f"INFO round {number} applied" in text for number in (1, 2, 3, 5, 10))


def test_the_log_file_gets_every_line(tmp_path: Path) -> None:
    configure_logging("INFO", tmp_path / "aggregator.log", label="aggregator")
    run_rounds(logging.getLogger("fedfair.aggregator"))
    for handler in logging.getLogger().handlers:
        handler.flush()
    logged = (tmp_path / "aggregator.log").read_text()
    assert all(f"INFO round {number} applied" in logged for number in (1, 2, 3, 5, 10))
    assert LOG_FORMAT.startswith("%(asctime)s")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device every write to fails ENOSPC)")
def test_a_log_file_on_a_full_disk_warns_once_and_the_process_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    """Every line written to /dev/full fails with ENOSPC, as on a full disk: one warning naming the file,
    no traceback (logging's default prints one per line), and the console keeps its lines."""
    configure_logging("INFO", Path("/dev/full"), label="site-a")
    log = logging.getLogger("fedfair.collaborator")
    for number in range(3):
        log.warning("site-a: line %d", number)
    error = capsys.readouterr().err
    assert "Traceback" not in error and "Logging error" not in error
    warnings = [line for line in error.splitlines() if line.startswith("fedfair: warning: the disk is full")]
    assert len(warnings) == 1 and "/dev/full" in warnings[0]
    assert all(f"site-a: line {number}" in error for number in range(3))


def test_grpc_logging_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    quiet_grpc()
    assert os.environ["GRPC_VERBOSITY"] == "NONE"
    monkeypatch.setenv("GRPC_VERBOSITY", "DEBUG")
    quiet_grpc()
    assert os.environ["GRPC_VERBOSITY"] == "DEBUG"


def test_every_command_turns_grpc_logging_off_before_it_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not only those that configure logging: `fedfair launch`'s parent and the processes it starts inherit it."""
    from fedfair import cli

    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    cli.main(["status", str(tmp_path)])  # a folder with no logs: an error, after the variable is set
    assert os.environ["GRPC_VERBOSITY"] == "NONE"
    assert "fedfair: error:" in capsys.readouterr().err
