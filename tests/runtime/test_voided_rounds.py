"""A survivor lost before its tag costs no round where every site re-sums the sum (issues 65 and 79).

Real processes over loopback mutual TLS: site-c dies (kill -9) in round 2 once its sum is unmasked, right
before it sends its tag of the claimed sum, and never comes back. Every site re-sums the sum itself (a small
model: ``SecAggConfig.resummed``, on the complete graph), so its own re-sum decides and site-c's tag plays no
part in the sum's value: the aggregator relays the tags it has, and round 2 applies with site-c's input in it.
Every later round applies without site-c, with or without ``[privacy] mode = "distributed"``: no input is ever
signed for two survivor sets, so nothing binds the sites that stayed. Before, the aggregator voided round 2
(nobody could verify it); without noise every later round was void too (the sites' inputs on the unchanged model
were bound to round 2's survivors: 1 of 4 rounds applied), and under noise round 2 alone (4 of 5).

Above RESUMMED_WORDS the tags check the sum, and a round whose tag is missing is re-summed all the same, from the
survivors' masked inputs that the aggregator sends with the tags of that round alone: the second test runs every
process with the bound patched down to 0 words (a test-only launcher, :data:`ABOVE_THE_BOUND`; a model of 1.4
million parameters would be the real thing). On a SecAgg+ graph a missing tag still voids the round:
tests/secagg/test_resum_leavers.py, and the binding that follows, tests/runtime/test_waiting.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.faults import VARIABLE as FAULT
from fedfair.runtime.local.processes import (
    FEDFAIR_COMMAND,
    Child,
    aggregator_command,
    child_environment,
    collaborator_command,
)
from fedfair.runtime.local.workspace import Workspace
from tests.runtime.harness import Processes, new_workspace

NAMES = ("site-a", "site-b", "site-c")
TIMEOUT = 10.0
ROUNDS = 4


@pytest.mark.slow
@pytest.mark.parametrize("noised", [False, True], ids=["no-noise", "distributed-noise"])
def test_a_survivor_lost_before_its_tag_costs_no_round(tmp_path: Path, processes: Processes, noised: bool) -> None:
    privacy = {"privacy": {"mode": "distributed", "epsilon": 3.0, "report_epsilon": 1.0}} if noised else {}
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": ROUNDS, "server_momentum": 0.0, "local_steps": 1},
        quorum={"min_collaborators": 2, "round_timeout_seconds": TIMEOUT},
        **privacy,
    )
    aggregator = processes.aggregator(workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES[:2]}
    lost = processes.collaborator(workspace, "site-c", fault="before-upload:2:STAGE_VERIFY_CLAIM")
    assert lost.wait(120) == -9, processes.tail()
    assert aggregator.wait(240) == 0, processes.tail()
    check_every_round_applied_and_the_bundles_kept(workspace, processes, sites)


ABOVE_THE_BOUND = [
    sys.executable,
    "-c",
    "import sys; from fedfair.secagg import config; config.RESUMMED_WORDS = 0; "
    "from fedfair.runtime.collaborator import client; client.large = lambda size: True; "
    "from fedfair.cli import main; sys.exit(main())",
]
"""`fedfair`, with every sum above RESUMMED_WORDS (patched to 0 words before anything runs), so the aggregator's
masked inputs kept in files (:mod:`~fedfair.runtime.aggregator.kept_inputs`), and the sites' tag sets kept in
files as a large model's are (``Uplink.input_in_file``): tests only.
Not a ``FEDFAIR_COMMAND``, so each party is executed afresh rather than forked from the forkserver."""


def start_above_the_bound(
    processes: Processes, label: str, command: list[str], fault: str | None = None, watch: str | None = None
) -> Child:
    """Start the `fedfair` command line `command` as :data:`ABOVE_THE_BOUND`, among `processes`' children."""
    env = child_environment({FAULT: fault} if fault else None)
    child = Child(label, ABOVE_THE_BOUND + command[len(FEDFAIR_COMMAND) :], env=env, sink=processes.log, watch=watch)
    processes.children.append(child)
    return child


def check_every_round_applied_and_the_bundles_kept(
    workspace: Workspace, processes: Processes, sites: dict[str, Child]
) -> None:
    log = read_round_log(workspace.output)
    statuses = [(record["round"], record["status"]) for record in log]
    assert statuses == [(n, "applied") for n in range(1, ROUNDS + 1)], statuses
    # Round 2's sum holds site-c's input (it masked it); the model moved, and the later rounds went on without it.
    assert log[1]["contributors"] == list(NAMES), log[1]
    assert log[2]["model_sha256"] != log[1]["model_sha256"]
    for record in log[2:]:
        assert record["contributors"] == ["site-a", "site-b"], record
    for name, site in sites.items():
        assert site.wait(60) == 0, processes.tail()  # every model checked, the bundle kept
        config = workspace.configs[name]
        record = OutcomeRecord(next(config.parent.glob(f"{name}.*.{OUTCOME_SUFFIX}")), 0)
        assert record.refusal is None, name
        assert record.contributed == ROUNDS, (name, record.contributed)
        assert record.sat_out == {}, (name, record.sat_out)  # the closed chain checked every model it was sent
        assert list(config.parent.glob(f"{name}.*.model_bundle.pt")), name


@pytest.mark.slow
def test_above_the_bound_a_survivor_lost_before_its_tag_costs_no_round(tmp_path: Path, processes: Processes) -> None:
    """Without noise, where the tags check every sum: round 2 is re-summed from the tag set, and every round applies."""
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": ROUNDS, "server_momentum": 0.0, "local_steps": 1},
        quorum={"min_collaborators": 2, "round_timeout_seconds": TIMEOUT},
    )
    aggregator = start_above_the_bound(
        processes, "aggregator", aggregator_command(workspace), watch="listening on port"
    )
    assert aggregator.seen.wait(120) and aggregator.process.poll() is None, processes.tail()
    sites = {name: start_above_the_bound(processes, name, collaborator_command(workspace, name)) for name in NAMES[:2]}
    lost = start_above_the_bound(
        processes, "site-c", collaborator_command(workspace, "site-c"), fault="before-upload:2:STAGE_VERIFY_CLAIM"
    )
    assert lost.wait(120) == -9, processes.tail()
    assert aggregator.wait(240) == 0, processes.tail()
    check_every_round_applied_and_the_bundles_kept(workspace, processes, sites)
    # The tags checked every sum but round 2's (secure session 4 = 2 r), which both sites re-summed from the tag set.
    said = [line for site in sites.values() for line in site.lines if "this party re-summed the sum" in line]
    assert len(said) == 2 and all("session 4: no tag from site-c" in line for line in said), said
    sent = [line for line in aggregator.lines if "the tag set carries the survivors' 3 masked inputs" in line]
    assert len(sent) == 1 and "session 4: no tag from site-c" in sent[0], sent
