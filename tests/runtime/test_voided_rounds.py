"""A round voided after its sum was unmasked costs that round at most (issues 65 and 79, verified aggregation).

Real processes over loopback mutual TLS: site-c dies (kill -9) in round 2 once its sum is unmasked, right
before it sends its tag of the claimed sum, and never comes back. Nobody can verify that sum, so the aggregator
voids it (model unchanged).

- Under ``[privacy] mode = "distributed"`` each site's input is one round's noised release: the next round on
  the same model trains afresh with the sites still there, and every later round applies; the sites that stayed
  check every model and end with exit 0 and a bundle.
- Without noise every other site's input on that model is bound to the survivors of that sum, so the aggregator
  waits for site-c as long as a start is allowed, then voids the later rounds at once, naming round 2 and
  site-c, and the federation ends in bounded time, every site saying so (its record: 1 round).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.starts import START_FLOOR_SECONDS
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from tests.runtime.harness import Processes, new_workspace

NAMES = ("site-a", "site-b", "site-c")
TIMEOUT = 10.0


@pytest.mark.slow
def test_a_survivor_lost_before_its_tag_voids_the_round_and_the_federation_ends(
    tmp_path: Path, processes: Processes
) -> None:
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": 4, "server_momentum": 0.0},
        quorum={"min_collaborators": 2, "round_timeout_seconds": TIMEOUT},
    )
    aggregator = processes.aggregator(workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES[:2]}
    lost = processes.collaborator(workspace, "site-c", fault="before-upload:2:STAGE_VERIFY_CLAIM")
    assert lost.wait(120) == -9, processes.tail()
    lost_at = time.monotonic()
    assert aggregator.wait(START_FLOOR_SECONDS + 120) == 3, processes.tail()
    # One wait for site-c, as long as a start is allowed (it may be restarting), then rounds 3 and 4 void at once
    # (and the final evaluation).
    assert time.monotonic() - lost_at < max(TIMEOUT, START_FLOOR_SECONDS) + 60, processes.tail()

    log = read_round_log(workspace.output)
    assert [(record["round"], record["status"]) for record in log] == [
        (1, "applied"),
        (2, "aborted"),
        (3, "aborted"),
        (4, "aborted"),
    ]
    assert "no tag of the claimed sum from site-c" in log[1]["reason"], log[1]
    for record in log[2:]:
        assert "round 2's sum over site-a, site-b, site-c was unmasked but voided" in record["reason"], record
        assert "site-c is not connected" in record["reason"], record
    # No site applied round 2: every later round started from the model round 2 started from.
    assert {record["model_sha256"] for record in log[1:]} == {log[1]["model_sha256"]}

    for name, site in sites.items():
        # The final evaluation's model follows no sum a survivor verified: it sits it out, keeps no bundle and
        # ends with model-unchecked (exit 2; the closed chain, docs/security.md), not a plain short run (3).
        assert site.wait(60) == 2, processes.tail()
        config = workspace.configs[name]
        record = OutcomeRecord(next(config.parent.glob(f"{name}.*.{OUTCOME_SUFFIX}")), 0)
        assert record.contributed == 1 and record.refusal is None, name  # round 1 only; nothing refused


@pytest.mark.slow
def test_under_distributed_noise_a_survivor_lost_before_its_tag_costs_only_its_round(
    tmp_path: Path, processes: Processes
) -> None:
    rounds = 5
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": rounds, "server_momentum": 0.0, "local_steps": 1},
        # The operator tolerates the one round the lost site costs: the run is then complete (exit 0).
        quorum={"min_collaborators": 2, "round_timeout_seconds": TIMEOUT, "aborted_rounds_allowed": 1},
        privacy={"mode": "distributed", "epsilon": 3.0},
    )
    aggregator = processes.aggregator(workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES[:2]}
    lost = processes.collaborator(workspace, "site-c", fault="before-upload:2:STAGE_VERIFY_CLAIM")
    assert lost.wait(120) == -9, processes.tail()
    assert aggregator.wait(240) == 0, processes.tail()

    log = read_round_log(workspace.output)
    statuses = [(record["round"], record["status"]) for record in log]
    assert statuses == [(1, "applied"), (2, "aborted")] + [(n, "applied") for n in range(3, rounds + 1)], statuses
    assert "no tag of the claimed sum from site-c" in log[1]["reason"], log[1]
    # Round 3 started from the model round 2 left unchanged, and went on without site-c.
    assert log[2]["model_sha256"] == log[1]["model_sha256"]
    for record in log[2:]:
        assert record["contributors"] == ["site-a", "site-b"], record

    for name, site in sites.items():
        assert site.wait(60) == 0, processes.tail()  # every model checked, the bundle kept
        config = workspace.configs[name]
        record = OutcomeRecord(next(config.parent.glob(f"{name}.*.{OUTCOME_SUFFIX}")), 0)
        assert record.refusal is None, name
        assert record.contributed == rounds - 1, (name, record.contributed)  # every round but the voided one
        assert record.sat_out == {}, (name, record.sat_out)  # the closed chain checked every model it was sent
        assert list(config.parent.glob(f"{name}.*.model_bundle.pt")), name
