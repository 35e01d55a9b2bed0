"""Verified aggregation in a real federation: an aggregator that applies another model than the sites' sum is
refused by every site (issue 65).

Three ``fedfair collaborator start`` processes, real gRPC over loopback mutual TLS, and an aggregator process
(tests/runtime/forging_aggregator.py) that forges round 2's training sum and shows it to the sites as the sum
it applies, relaying their tags without its own check. Round 1 is honest and applied; at round 2 every site
finds that the survivors' tags do not sum to the claimed sum, refuses it, exits with status 2 and
``aggregate-refused``, records the round and the reason, and keeps no bundle of the federation. The same
aggregator claiming round 1's true sum but sending round 2 a flipped model is refused at round 2 (NEXT_MODEL), and
one forging the final round's evaluation sums (the report's figures) is refused at that round (FORGED), and one
sending a backdoored initial model is refused at round 1 (INITIAL_MODEL, issue 79).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord, Refusal
from fedfair.runtime.local.processes import Child, child_environment
from fedfair.runtime.local.workspace import Workspace
from tests.runtime.harness import Processes, new_workspace

NAMES = ("site-a", "site-b", "site-c")
FORGED_ROUND = 2
FORGER = Path(__file__).with_name("forging_aggregator.py")


def forged_federation(
    tmp_path: Path, processes: Processes, training: dict[str, object], *attack: str
) -> tuple[Workspace, dict[str, Child]]:
    """Three sites of a 3-round plan (`training` added) and the forging aggregator running `attack` against them."""
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": 3, **training}, quorum={"min_collaborators": 3})
    aggregator = Child(
        "aggregator",
        [sys.executable, str(FORGER), str(workspace.plan), *attack],
        env=child_environment(),
        sink=processes.log,
        watch="listening on port",
    )
    processes.children.append(aggregator)
    assert aggregator.seen.wait(120) and aggregator.process.poll() is None, processes.tail()
    return workspace, {name: processes.collaborator(workspace, name) for name in NAMES}


def refusals(
    workspace: Workspace, sites: dict[str, Child], reason: str, forged_round: int = FORGED_ROUND
) -> list[tuple[Refusal, int]]:
    """Each site's refusal, with round 1 verified and applied (:func:`site_refusals`)."""
    found = site_refusals(workspace, sites, reason, forged_round)
    # Round 1 was the sites' own sum: every site verified it and the aggregator applied it.
    first = json.loads((workspace.output / "rounds.jsonl").read_text().splitlines()[0])
    assert first["round"] == 1 and first["status"] == "applied", first
    return found


def site_refusals(
    workspace: Workspace, sites: dict[str, Child], reason: str, forged_round: int
) -> list[tuple[Refusal, int]]:
    """Each site's refusal of `forged_round` for `reason`, with its rounds contributed.

    Once every site exited 2 saying so and kept no bundle.
    """
    found = []
    for name, site in sites.items():
        assert site.wait(180) == 2, f"{name}: {site.lines[-20:]}"
        said = "\n".join(site.lines)
        assert f"aggregate-refused: round {forged_round}:" in said and reason in said, said[-3000:]
        config = workspace.configs[name]
        record = OutcomeRecord(next(config.parent.glob(f"{name}.*.{OUTCOME_SUFFIX}")), 0)
        assert record.refusal is not None and (record.refusal.round, record.refusal.reason) == (forged_round, reason)
        assert not list(config.parent.glob("*model_bundle*")), "a site kept a bundle of a refused federation"
        found.append((record.refusal, record.contributed))
    return found


@pytest.mark.slow
def test_a_forged_sum_is_refused_by_every_site_naming_the_round(tmp_path: Path, processes: Processes) -> None:
    workspace, sites = forged_federation(tmp_path, processes, {"server_momentum": 0.0}, str(FORGED_ROUND))
    for refusal, _ in refusals(workspace, sites, "FORGED"):
        # Three sites and a small model: every site re-sums the survivors' masked inputs (config.resummed).
        assert "is not the sum of the survivors' masked inputs" in refusal.detail


@pytest.mark.slow
def test_a_model_other_than_the_verified_sums_step_is_refused_by_every_site(
    tmp_path: Path, processes: Processes
) -> None:
    """The aggregator claims round 1's true sum (every site verifies it) and sends round 2 a flipped model."""
    workspace, sites = forged_federation(tmp_path, processes, {}, str(FORGED_ROUND - 1), "model")
    for refusal, contributed in refusals(workspace, sites, "NEXT_MODEL"):
        assert "server step applied to the sum of round 1" in refusal.detail
        # Refused before anything trained on the flipped model: only round 1's sum holds this site's update.
        assert contributed == 1, contributed


@pytest.mark.slow
def test_forged_evaluation_sums_are_refused_by_every_site(tmp_path: Path, processes: Processes) -> None:
    """The final round's evaluation sums, what the report's figures are made of, forged: every site refuses them."""
    workspace, sites = forged_federation(tmp_path, processes, {}, "3", "evaluation")
    for refusal, contributed in refusals(workspace, sites, "FORGED", forged_round=3):
        # Three sites and a small model: every site re-sums the survivors' masked inputs (config.resummed).
        assert "is not the sum of the survivors' masked inputs" in refusal.detail
        assert contributed == 3, contributed  # every training round was verified and applied


@pytest.mark.slow
def test_a_backdoored_initial_model_is_refused_at_round_1_by_every_site(tmp_path: Path, processes: Processes) -> None:
    """Round 1's model with +1.0 on one weight: each site builds the plan's initial model itself and refuses it."""
    workspace, sites = forged_federation(tmp_path, processes, {}, "1", "initial")
    for refusal, contributed in site_refusals(workspace, sites, "INITIAL_MODEL", forged_round=1):
        assert "values differ, the largest by 1;" in refusal.detail, refusal.detail
        assert contributed == 0, contributed  # nothing trained on it
