"""Issue 98's acceptance: a changed table gives its named error within 60 s, before any round, with its fix.

Three institutions' own CSV tables, a plan without noise (so no privacy ledger compares the table with the one its
record was made on); site-a's process is killed (a crash, a reboot) at round 3 and, while it is down, its table is
exported again with 30 of its 2,000 rows fewer (patients removed); then site-a is started again with the same
command. Its record bound the table's fingerprint at its first join, so the restart is refused: `table-changed`,
naming the table and the federation, with the fix (restore the table, or a new federation), not the record's
(`local-bindings` ... from a backup). Found by the red team (FINDINGS.md 3 on branch redops): before, the restarted
site-a contributed to every later round on the changed table.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fedfair.datasets.builtin import ADULT_COLUMNS
from fedfair.datasets.schema import Column, draft_schema
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.local.processes import FEDFAIR_COMMAND, child_environment
from fedfair.runtime.local.workspace import make_workspace
from tests.federations import adult_raw_table
from tests.runtime.harness import Processes, plan_sections

NAMES = ["site-a", "site-b", "site-c"]
FEATURES = [name for name in ADULT_COLUMNS if name not in ("fnlwgt", "income")]
NAMED_WITHIN_SECONDS = 60.0
WAIT_SECONDS = 300.0


@pytest.mark.slow
def test_a_table_changed_while_its_site_was_down_is_named_before_it_rejoins(
    tmp_path: Path, processes: Processes
) -> None:
    table = adult_raw_table().iloc[:6000]
    tables = {}
    for index, name in enumerate(NAMES):
        tables[name] = tmp_path / "tables" / f"{name}.csv"
        tables[name].parent.mkdir(exist_ok=True)
        table.iloc[index * 2000 : (index + 1) * 2000].to_csv(tables[name], index=False)
    drafted = draft_schema(adult_raw_table(), "income", FEATURES)
    learnt = tuple(  # native-country learnt from the sum: a slice need not hold every country
        Column(column.name, column.kind, None) if column.name == "native-country" else column
        for column in drafted.columns
    )
    workspace = make_workspace(
        tmp_path / "federation",
        NAMES,
        plan=plan_sections(
            training={"rounds": 2000}, quorum={"min_collaborators": 2}, secure_aggregation={"enabled": False}
        ),
        data={name: {"csv": str(path)} for name, path in tables.items()},
    )
    workspace.plan.write_text(
        workspace.plan.read_text() + "\n" + dataclasses.replace(drafted, columns=learnt).to_toml()
    )
    aggregator = processes.aggregator(workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES}
    deadline = time.monotonic() + WAIT_SECONDS
    while len(read_round_log(workspace.output)) < 3:
        assert aggregator.process.poll() is None and time.monotonic() < deadline, processes.tail()
        time.sleep(0.1)
    sites["site-a"].process.send_signal(signal.SIGKILL)
    sites["site-a"].wait(60)
    kept = table.iloc[30:2000]  # 30 patients fewer, the other 1,970 rows as they were
    kept.to_csv(tables["site-a"], index=False)

    logged = len(read_round_log(workspace.output))
    began = time.monotonic()
    try:
        restarted = subprocess.run(
            [*FEDFAIR_COMMAND, "collaborator", "start", "--config", str(workspace.configs["site-a"])],
            capture_output=True,
            text=True,
            env=child_environment(),
            timeout=NAMED_WITHIN_SECONDS + 30.0,  # the bound, and a loaded machine's slack to say it
        )
    except subprocess.TimeoutExpired:
        joined = [
            record["round"] for record in read_round_log(workspace.output) if "site-a" in record.get("contributors", [])
        ]
        pytest.fail(f"no named error: site-a still ran on its changed table, in rounds up to {joined[-1]}")
    waited = time.monotonic() - began
    errors = [line for line in restarted.stderr.splitlines() if line.startswith("fedfair: error:")]
    assert restarted.returncode == 2 and len(errors) == 1, restarted.stderr[-3000:]
    assert waited <= NAMED_WITHIN_SECONDS, f"named {waited:.1f} s after the command"
    (error,) = errors
    assert error.startswith("fedfair: error: table-changed: the table at ") and tables["site-a"].name in error, error
    assert " changed since this site joined federation " in error, error
    assert "restore the table it joined with" in error and "fedfair plan renew" in error, error
    assert "from a backup" not in error and "local-bindings" not in error, json.dumps(error)
    # Before any round: the rounds since the restart (one in flight at the kill aside) went on without it.
    since = read_round_log(workspace.output)[logged + 1 :]
    assert not any("site-a" in record.get("contributors", []) for record in since), "site-a contributed again"
