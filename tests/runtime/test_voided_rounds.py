"""A survivor lost before its tag costs no round where every site re-sums the sum (issues 65 and 79).

Real processes over loopback mutual TLS: site-c dies (kill -9) in round 2 once its sum is unmasked, right
before it sends its tag of the claimed sum, and never comes back. Every site re-sums the sum itself (a small
model: ``SecAggConfig.resummed``, on the complete graph), so its own re-sum decides and site-c's tag plays no
part in the sum's value: the aggregator relays the tags it has, and round 2 applies with site-c's input in it.
Every later round applies without site-c, with or without ``[privacy] mode = "distributed"``: no input is ever
signed for two survivor sets, so nothing binds the sites that stayed. Before, the aggregator voided round 2
(nobody could verify it); without noise every later round was void too (the sites' inputs on the unchanged model
were bound to round 2's survivors: 1 of 4 rounds applied), and under noise round 2 alone (4 of 5).

Where the tags check the sum alone (above RESUMMED_WORDS, or on a SecAgg+ graph) a missing tag still voids the
round: tests/secagg/test_resum_leavers.py, and the binding that follows, tests/runtime/test_waiting.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from tests.runtime.harness import Processes, new_workspace

NAMES = ("site-a", "site-b", "site-c")
TIMEOUT = 10.0
ROUNDS = 4


@pytest.mark.slow
@pytest.mark.parametrize("noised", [False, True], ids=["no-noise", "distributed-noise"])
def test_a_survivor_lost_before_its_tag_costs_no_round(tmp_path: Path, processes: Processes, noised: bool) -> None:
    privacy = {"privacy": {"mode": "distributed", "epsilon": 3.0}} if noised else {}
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
