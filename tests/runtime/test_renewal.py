"""A finished federation stops, and ``fedfair plan renew`` runs it again as a new federation of the same
sites and certificates, with nothing deleted by hand (real processes over loopback mutual TLS).

The first-day story (issue 43): the aggregator started again on a finished federation's id (a new
output folder, nothing else changed) met collaborators whose records are past its rounds, and both
sides looped for ever. Now each collaborator stops at once with the permanent ``federation-past``
message, exit status non-zero, its record untouched; ``plan renew`` is the way on. The renewed
federation asks the same data again, so each site's privacy ledger continues from what the first spent
(issue 51, item 4).

The finished federation served again is real processes (their exit statuses and console lines are the
story); the first and the renewed federation, which only leave their records, ledgers and logs behind,
run in threads of the test (the real gRPC server over loopback mutual TLS, real `Collaborator`s), sparing
eight process start-ups."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest

from fedfair.cli import main as cli_main
from fedfair.core.errors import ConfigError
from fedfair.privacy.ledger import Ledger, composed
from fedfair.runtime.output_folder import FINAL_SUMMARY_NAME
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.plan.pinning import set_value
from tests.runtime.harness import Processes, plan_sections, thread_federation

NAMES = ["site-a", "site-b", "site-c"]


def test_set_value_keeps_the_comment_adds_a_missing_key_and_names_a_missing_table(tmp_path: Path) -> None:
    text = '[federation]\nid = "old"   # ties every message\n\n[aggregator]\nname = "aggregator"\n'
    renewed = set_value(text, "federation", "id", '"new"', tmp_path / "plan.toml")
    assert renewed.splitlines()[1] == 'id = "new"   # ties every message'
    added = set_value(renewed, "aggregator", "output", '"output-new"', tmp_path / "plan.toml")
    assert added.splitlines()[4:6] == ['output = "output-new"', 'name = "aggregator"']
    with pytest.raises(ConfigError, match=r"plan.toml has no \[collaborator\] table"):
        set_value(text, "collaborator", "federation", '"new"', tmp_path / "plan.toml")


DELTA = 1e-5
"""The plan's [privacy] delta (its default)."""


def site_ledger(config: Path) -> Ledger:
    """The privacy ledger of the site whose collaborator.toml is `config`."""
    return open_ledger(load_collaborator_config(config))


def record_bytes(config: Path, name: str) -> bytes:
    """A collaborator's record of the inputs it signed for, in the first federation."""
    return (config.parent / f"{name}.fedfair-launch.bindings.json").read_bytes()


@pytest.mark.slow
def test_a_finished_federation_stops_and_runs_again_as_a_new_one_with_fresh_state(
    tmp_path: Path, processes: Processes, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    rounds = 2
    sections = plan_sections(
        # Noised evaluation answers every round (averaging from round 0, so each round's model is new).
        training={"rounds": rounds, "average_from": 0.0},
        quorum={"min_collaborators": 3},
        evaluation={"every": 1},
        privacy={"report_epsilon": 1.0, "budget": 10.0},
    )
    workspace = make_workspace(tmp_path, NAMES, plan=sections, manifest=True)
    first_output = load_aggregator_plan(workspace.plan).aggregator.output

    def run() -> None:
        with caplog.at_level(logging.INFO, logger="fedfair"), thread_federation(workspace) as federation:
            federation.join()
        assert not federation.errors, federation.errors
        assert federation.exits == dict.fromkeys(NAMES, 0) and federation.summary["aborted_rounds"] == 0

    run()
    first_log = read_round_log(first_output)
    kept_records = {name: record_bytes(workspace.configs[name], name) for name in NAMES}
    first_spent = {name: site_ledger(workspace.configs[name]).spent(DELTA) for name in NAMES}
    first_releases = {name: len(site_ledger(workspace.configs[name]).releases("fedfair-launch")) for name in NAMES}
    assert all(spent > 0 for spent in first_spent.values()), first_spent

    # The same federation served again from scratch: every collaborator says it is over and stops.
    again = processes.aggregator(workspace, "--output", str(tmp_path / "output-again"))
    stopped = {name: processes.collaborator(workspace, name) for name in NAMES}
    for name, child in stopped.items():
        assert child.wait(120) != 0, processes.tail()
        said = "\n".join(child.lines)
        served = re.search(
            rf"federation-past: this institution already contributed to round {rounds} of federation fedfair-launch "
            r"\(.*\), and the aggregator now serves round (\d+)",
            said,
        )
        assert served is not None and int(served.group(1)) < rounds, said
        assert "that federation finished" in said and "fedfair plan renew" in said, said
        assert record_bytes(workspace.configs[name], name) == kept_records[name]  # nothing re-signed
    # No round was applied with a finished federation's sites: what began was aborted.
    assert {record["status"] for record in read_round_log(tmp_path / "output-again")} <= {"aborted"}
    again.kill()
    manifest, renewed = tmp_path / "manifest.toml", tmp_path / "manifest-2.toml"
    configs = [word for name in NAMES for word in ("--config", str(workspace.configs[name]))]
    command = ["plan", "renew", "--plan", str(workspace.plan), "--manifest", str(manifest)]
    assert cli_main([*command, "--federation", "second", "--out", str(renewed), *configs]) == 0
    said = capsys.readouterr().out
    assert "federation second:" in said and "manifest sha256 " in said
    os.replace(renewed, manifest)  # every institution puts the agreed new manifest in place of the old

    run()
    plan = load_aggregator_plan(workspace.plan)
    assert plan.federation_id == "second" and plan.aggregator.output == workspace.plan.parent / "output-second"
    summary = json.loads((plan.aggregator.output / FINAL_SUMMARY_NAME).read_text())
    assert summary["federation_id"] == "second" and summary["applied_rounds"] == rounds
    assert [record["status"] for record in read_round_log(plan.aggregator.output)] == ["applied"] * rounds
    assert read_round_log(first_output) == first_log  # the first federation's record is untouched
    for name in NAMES:
        # Each site's record of its inputs is per federation: the new one started afresh beside the old.
        kept = {path.name for path in workspace.configs[name].parent.glob(f"{name}.*.bindings.json")}
        assert kept == {f"{name}.fedfair-launch.bindings.json", f"{name}.second.bindings.json"}, kept
        # ... but its privacy ledger is its data's: the second federation's answers compose on the first's.
        ledger = site_ledger(workspace.configs[name])
        assert len(ledger.releases("fedfair-launch")) == first_releases[name] and ledger.releases("second")
        assert ledger.spent(DELTA) == pytest.approx(composed(ledger.releases(), DELTA), rel=1e-12)
        assert ledger.spent(DELTA) > first_spent[name] and ledger.spent(DELTA) > ledger.spent(DELTA, "second")
        # The first charge of the new federation already counted the old spend, and said so in the site's log.
        charged = re.findall(rf"{name}: round 1 evaluation: .* epsilon ([0-9.e+-]+) of budget 10 spent", caplog.text)
        assert len(charged) == 2 and float(charged[1]) > first_spent[name], charged
    assert cli_main(["collaborator", "ledger", "--config", str(workspace.configs["site-a"])]) == 0
    shown = capsys.readouterr().out
    assert "federation fedfair-launch: epsilon" in shown and "federation second: epsilon" in shown, shown
