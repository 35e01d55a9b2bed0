"""Above the re-sum bound, where the plan allows a colluder, the sites re-check each other's masked inputs (issue 97).

Real processes over loopback mutual TLS, every one run with RESUMMED_WORDS patched down to 0 words (the test-only
launchers tests/runtime/colluding_aggregator.py and test_voided_rounds's :data:`ABOVE_THE_BOUND`; a model of 1.4
million parameters at n = 3 would be the real thing). Three sites, ``max_colluding = 1``: each site is sent the
masked inputs of the two others with its claim and reports their re-checked values in its tag. An honest aggregator
applies every round and every site keeps its bundle; an aggregator that forges round 2's sum, with site-c's tag and
reported value moved to cover it (the tags alone would accept it: tests/secagg/test_resum.py), is refused by every
site naming round 2 and FORGED. A site that signs one false re-checked value (an honest aggregator) is named and
excluded, and the round goes on without its tag, re-summed by the others from the tag set.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.local.processes import (
    FEDFAIR_COMMAND,
    Child,
    aggregator_command,
    child_environment,
    collaborator_command,
)
from fedfair.runtime.local.workspace import Workspace
from tests.runtime.harness import Processes, new_workspace
from tests.runtime.test_verified_sums import refusals
from tests.runtime.test_voided_rounds import start_above_the_bound

NAMES = ("site-a", "site-b", "site-c")
ROUNDS = 3
FORGED_ROUND = 2
COLLUDING = Path(__file__).with_name("colluding_aggregator.py")
LYING = Path(__file__).with_name("lying_site.py")


def rechecked_workspace(tmp_path: Path, names: tuple[str, ...]) -> Workspace:
    """A plan for `names` allowing one colluder, of quorum 3 (max_colluding + 2)."""
    return new_workspace(
        tmp_path,
        names,
        training={"rounds": ROUNDS, "server_momentum": 0.0, "local_steps": 1},
        quorum={"min_collaborators": 3},
        secure_aggregation={"enabled": True, "max_colluding": 1},
    )


def rechecked_federation(tmp_path: Path, processes: Processes, forged_round: int) -> tuple[Workspace, dict[str, Child]]:
    """Three sites allowing one colluder, every sum above the bound, and the aggregator forging `forged_round` (0: none)."""
    workspace = rechecked_workspace(tmp_path, NAMES)
    colluder_key = workspace.certs / "site-c.key"
    assert colluder_key.is_file()
    command = [sys.executable, str(COLLUDING), str(workspace.plan), str(forged_round), str(colluder_key)]
    aggregator = Child("aggregator", command, env=child_environment(), sink=processes.log, watch="listening on port")
    processes.children.append(aggregator)
    assert aggregator.seen.wait(120) and aggregator.process.poll() is None, processes.tail()
    sites = {name: start_above_the_bound(processes, name, collaborator_command(workspace, name)) for name in NAMES}
    return workspace, sites


@pytest.mark.slow
def test_an_honest_federation_above_the_bound_applies_every_round(tmp_path: Path, processes: Processes) -> None:
    workspace, sites = rechecked_federation(tmp_path, processes, 0)
    for name, site in sites.items():
        assert site.wait(240) == 0, processes.tail()
        record = OutcomeRecord(next(workspace.configs[name].parent.glob(f"{name}.*.{OUTCOME_SUFFIX}")), 0)
        assert record.refusal is None and record.contributed == ROUNDS, (name, record.refusal, record.contributed)
        assert list(workspace.configs[name].parent.glob(f"{name}.*.model_bundle.pt")), name
    statuses = [(record["round"], record["status"]) for record in read_round_log(workspace.output)]
    assert statuses == [(n, "applied") for n in range(1, ROUNDS + 1)], statuses


@pytest.mark.slow
def test_a_sum_forged_with_a_colluding_site_is_refused_by_every_site(tmp_path: Path, processes: Processes) -> None:
    """site-c's covering tag and value pass the tag check alone; the re-check finds its report of site-a false."""
    workspace, sites = rechecked_federation(tmp_path, processes, FORGED_ROUND)
    found = refusals(workspace, sites, "FORGED")
    # Each counts round 1 and the forged round, whose sum holds its masked input.
    assert all(contributed == FORGED_ROUND for _refusal, contributed in found), found
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log][: FORGED_ROUND - 1] == ["applied"] * (FORGED_ROUND - 1), log


def lying_federation(tmp_path: Path, processes: Processes, how: str) -> tuple[Workspace, list[dict[str, Any]]]:
    """Four sites and an honest aggregator, site-d lying in round FORGED_ROUND `how` (lying_site.py's LIES).

    Four, so that three remain for ``max_colluding = 1`` once site-d is left out. Returns once site-a, b and c
    have each ended, exit 0 with every round counted: the workspace and rounds.jsonl's records.
    """
    names = (*NAMES, "site-d")
    workspace = rechecked_workspace(tmp_path, names)
    start_above_the_bound(processes, "aggregator", aggregator_command(workspace), watch="listening on port")
    assert processes.children[0].seen.wait(120), processes.tail()
    sites = {name: start_above_the_bound(processes, name, collaborator_command(workspace, name)) for name in NAMES}
    liar_command = collaborator_command(workspace, "site-d")[len(FEDFAIR_COMMAND) :]
    command = [sys.executable, str(LYING), str(FORGED_ROUND), how, *liar_command]
    liar = Child("site-d", command, env=child_environment(), sink=processes.log)
    processes.children.append(liar)
    for name, site in sites.items():
        assert site.wait(240) == 0, processes.tail()
        record = OutcomeRecord(next(workspace.configs[name].parent.glob(f"{name}.*.{OUTCOME_SUFFIX}")), 0)
        assert record.refusal is None and record.contributed == ROUNDS, (name, record.refusal, record.contributed)
    log = read_round_log(workspace.output)
    assert [(record["round"], record["status"]) for record in log] == [(n, "applied") for n in range(1, ROUNDS + 1)]
    assert log[FORGED_ROUND - 1]["contributors"] == list(names), log  # its input is in the sum the others re-summed
    return workspace, log


@pytest.mark.slow
def test_a_site_that_reports_a_false_value_is_named_and_the_round_applies(tmp_path: Path, processes: Processes) -> None:
    """site-d moves its first re-checked value of round 2 by 1 and signs it (the re-check red team's finding 2)."""
    _workspace, log = lying_federation(tmp_path, processes, "moved")
    named = log[FORGED_ROUND - 1]
    assert set(named.get("excluded", {})) == {"site-d"}, named  # the honest checker of the same peer is not named
    assert "re-checked value" in named["excluded"]["site-d"], named
    for record in log[FORGED_ROUND:]:
        assert record["contributors"] == list(NAMES), record


@pytest.mark.slow
def test_a_site_whose_value_is_cut_short_is_refused_as_read_and_the_round_applies(
    tmp_path: Path, processes: Processes
) -> None:
    """site-d cuts its first re-checked value of round 2 to 31 bytes and signs it (the re-check red team's finding 1).

    The aggregator's reader refuses the tag, naming its sender in the refusal's log line; the round goes on as
    without that tag, re-summed by the others from the tag set. A refused upload proves nothing to exclude for.
    """
    _workspace, log = lying_federation(tmp_path, processes, "short")
    assert "excluded" not in log[FORGED_ROUND - 1], log
    refusals = [line for line in processes.log.getvalue().splitlines() if "re-checked value of party" in line]
    assert refusals and all("site-d" in line and "party 4's" in line and "31 bytes" in line for line in refusals), (
        refusals or processes.tail()
    )
