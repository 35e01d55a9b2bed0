"""Verified aggregation in a real federation: an aggregator that applies another model than the sites' sum is
refused by every site (issue 65).

Three ``fedfair collaborator start`` processes, real gRPC over loopback mutual TLS, and an aggregator process
(tests/runtime/forging_aggregator.py) that forges round 2's training sum and shows it to the sites as the sum
it applies, relaying their tags without its own check. Round 1 is honest and applied; at round 2 every site
finds that the survivors' tags do not sum to the claimed sum, refuses it, exits with status 2 and
``aggregate-refused``, records the round and the reason, and keeps no bundle of the federation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.local.processes import Child, child_environment
from tests.runtime.harness import Processes, new_workspace

NAMES = ("site-a", "site-b", "site-c")
FORGED_ROUND = 2
FORGER = Path(__file__).with_name("forging_aggregator.py")


@pytest.mark.slow
def test_a_forged_sum_is_refused_by_every_site_naming_the_round(tmp_path: Path, processes: Processes) -> None:
    workspace = new_workspace(
        tmp_path, NAMES, training={"rounds": 3, "server_momentum": 0.0}, quorum={"min_collaborators": 3}
    )
    aggregator = Child(
        "aggregator",
        [sys.executable, str(FORGER), str(workspace.plan), str(FORGED_ROUND)],
        env=child_environment(),
        sink=processes.log,
        watch="listening on port",
    )
    processes.children.append(aggregator)
    assert aggregator.seen.wait(120) and aggregator.process.poll() is None, processes.tail()
    sites = {name: processes.collaborator(workspace, name) for name in NAMES}

    for name, site in sites.items():
        assert site.wait(180) == 2, processes.tail()
        said = "\n".join(site.lines)
        assert "aggregate-refused: round 2:" in said and "FORGED" in said, said[-3000:]
        config = workspace.configs[name]
        outcome = next(config.parent.glob(f"{name}.*.{OUTCOME_SUFFIX}"))
        refusal = OutcomeRecord(outcome, 0).refusal
        assert refusal is not None and (refusal.round, refusal.reason) == (FORGED_ROUND, "FORGED"), refusal
        assert "do not sum to the claimed aggregate" in refusal.detail
        assert not list(config.parent.glob("*model_bundle*")), "a site kept a bundle of a refused federation"

    # Round 1 was the sites' own sum: every site verified it and the aggregator applied it.
    first = json.loads((workspace.output / "rounds.jsonl").read_text().splitlines()[0])
    assert first["round"] == 1 and first["status"] == "applied", first
