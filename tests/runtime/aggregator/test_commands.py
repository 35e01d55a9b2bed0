"""``fedfair aggregator start``: a bad flag is blamed on the flag, the log goes where it is told, and
``--resume --readmit NAME`` lifts an exclusion durably or is refused naming the flag."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fedfair.cli import main as cli_main
from fedfair.core.errors import ConfigError
from fedfair.runtime.output_folder import FINAL_SUMMARY_NAME
from fedfair.runtime.aggregator.checkpoint import Checkpoint, append_round_log, read_round_log, save_checkpoint
from fedfair.cli.aggregator import readmit
from fedfair.runtime.failures import EXIT_INCOMPLETE
from fedfair.runtime.observe.events import read_events
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.aggregator.loop import excluded_in
from fedfair.runtime.local.workspace import Workspace
from fedfair.runtime.observe.logs import configure_logging
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, plan_digest
from tests.runtime.harness import new_workspace


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


def test_log_level_and_log_file(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "aggregator.log"
    configure_logging("warning", log_file)
    logging.getLogger("fedfair.aggregator").info("quiet")
    logging.getLogger("fedfair.aggregator").warning("loud")
    for handler in logging.getLogger().handlers:
        handler.flush()
    text = log_file.read_text()
    assert "WARNING loud" in text and "quiet" not in text


# ---------------------------------------------------------------- --resume --readmit NAME


@pytest.fixture()
def excluded_run(tmp_path: Path) -> Workspace:
    """A run checkpointed at round 2 that excluded site-c in round 1, and a stray record of round 3."""
    workspace = new_workspace(tmp_path, ["site-a", "site-b", "site-c"])
    plan = load_aggregator_plan(workspace.plan)
    output = plan.aggregator.output
    append_round_log(output, {"round": 1, "status": "aborted", "excluded": {"site-c": "sent a bad unmask share"}})
    append_round_log(output, {"round": 2, "status": "applied"})
    save_checkpoint(output, Checkpoint(2, initial_state(plan), plan_digest(plan)))
    append_round_log(output, {"round": 3, "status": "applied"})  # killed before its checkpoint
    return workspace


def test_readmit_lifts_an_exclusion_durably_logs_it_and_emits_an_event(
    excluded_run: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    plan = load_aggregator_plan(excluded_run.plan)
    output = plan.aggregator.output
    caplog.set_level(logging.INFO, logger="fedfair.aggregator")
    assert readmit(plan, ["site-c"]) == {"site-c": "sent a bad unmask share"}
    log = read_round_log(output)
    assert [record["round"] for record in log] == [1, 2]  # the round to be re-run is trimmed, as a resume does
    assert log[-1]["readmitted"] == ["site-c"] and excluded_in(log) == {}
    assert (
        "site-c re-admitted by --readmit after round 2 (it had been excluded: sent a bad unmask share); "
        "it takes part again from round 3"
    ) in caplog.messages
    [event] = [event for event in read_events(output) if event["event"] == "readmission"]
    assert (event["round"], event["name"], event["reason"]) == (2, "site-c", "sent a bad unmask share")
    # Excluded again later, it stays excluded: the log is applied in order.
    append_round_log(output, {"round": 3, "status": "aborted", "excluded": {"site-c": "accused"}})
    assert excluded_in(read_round_log(output)) == {"site-c": "accused"}


def test_readmit_of_a_name_that_is_not_excluded_is_blamed_on_the_flag_and_records_nothing(
    excluded_run: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = load_aggregator_plan(excluded_run.plan)
    before = read_round_log(plan.aggregator.output)
    command = ["aggregator", "start", "--plan", str(excluded_run.plan), "--resume"]
    assert cli_main([*command, "--readmit", "site-c", "--readmit", "site-a"]) == 2
    assert capsys.readouterr().err == (
        f"fedfair: error: --readmit site-a: not excluded in the run in {plan.aggregator.output} as of its "
        "checkpoint of round 2 (excluded now: site-c); correct the name or drop --readmit\n"
    )
    assert (
        excluded_in(read_round_log(plan.aggregator.output))
        == excluded_in(before)
        == {"site-c": "sent a bad unmask share"}
    )
    readmit(plan, ["site-c"])
    with pytest.raises(ConfigError, match=r"--readmit site-c: not excluded .* \(excluded now: nobody\)"):
        readmit(plan, ["site-c"])


def test_readmit_without_resume_is_refused(excluded_run: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["aggregator", "start", "--plan", str(excluded_run.plan), "--readmit", "site-c"]) == 2
    assert capsys.readouterr().err == (
        "fedfair: error: --readmit lifts an exclusion of the run being resumed and needs --resume; a fresh start "
        "excludes nobody, so drop --readmit (or add --resume)\n"
    )


def test_a_run_that_finished_with_aborted_rounds_says_so_and_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resumed run whose checkpoint is at the last round but whose model took fewer steps (the other
    rounds aborted) ends with the count in its closing line, the summary and a non-zero status. Its plan
    turns the report off ([aggregator] report = false): the line does not claim one and none is drawn."""
    workspace = new_workspace(tmp_path, ["site-a", "site-b", "site-c"], training={"rounds": 2})
    plan = load_aggregator_plan(workspace.plan)
    output = plan.aggregator.output
    for round_number in (1, 2):
        append_round_log(output, {"round": round_number, "status": "aborted", "reason": "too few survivors"})
    save_checkpoint(output, Checkpoint(2, initial_state(plan), plan_digest(plan)))
    code = cli_main(["aggregator", "start", "--plan", str(workspace.plan), "--resume"])
    assert code == EXIT_INCOMPLETE != 0
    closing = capsys.readouterr().err.splitlines()[-1]
    assert (
        " WARNING finished: 0 of 2 rounds applied, 2 aborted ([quorum] aborted_rounds_allowed = 0: exit 3); " in closing
    ), closing
    assert closing.endswith(f"; kept in {output}: the model bundle model_bundle.pt, the round log rounds.jsonl")
    assert not (output / "report.html").exists()
    summary = json.loads((output / FINAL_SUMMARY_NAME).read_text())
    assert (summary["applied_rounds"], summary["aborted_rounds"]) == (0, 2)


@pytest.mark.parametrize(("allowed", "code"), [(1, 0), (0, EXIT_INCOMPLETE)])
def test_one_aborted_round_within_the_plans_tolerance_exits_0_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], allowed: int, code: int
) -> None:
    """A run of one round that aborted: within [quorum] aborted_rounds_allowed = 1 it exits 0, its closing line a
    WARNING that says so; without the tolerance it exits 3."""
    workspace = new_workspace(
        tmp_path, ["site-a", "site-b", "site-c"], training={"rounds": 1}, quorum={"aborted_rounds_allowed": allowed}
    )
    plan = load_aggregator_plan(workspace.plan)
    append_round_log(plan.aggregator.output, {"round": 1, "status": "aborted", "reason": "too few survivors"})
    save_checkpoint(plan.aggregator.output, Checkpoint(1, initial_state(plan), plan_digest(plan)))
    assert cli_main(["aggregator", "start", "--plan", str(workspace.plan), "--resume"]) == code
    closing = capsys.readouterr().err.splitlines()[-1]
    said = f" WARNING finished: 0 of 1 rounds applied, 1 aborted ([quorum] aborted_rounds_allowed = {allowed}: exit {code}); "
    assert said in closing, closing
