"""A site that missed a verified round catches up and rejoins; a forged past round is refused (issue 98).

Real processes over loopback mutual TLS: site-c is killed (SIGKILL) in round 2 of 4, right before its tag of the
claimed sum. Round 2 applies (site-a and site-b re-sum it), so site-c's chain holds no verified sum of round 2 and,
restarted, could check no later model: before, it sat out rounds 3 and 4 and ended ``model-unchecked`` with no
bundle. The quorum is all three, so round 3 waits for site-c's restart. Now site-c fetches round 2's kept inputs,
checks the sum as a survivor would, steps its chain, and trains rounds 3 and 4 on models it checked: it ends with
exit 0, the same bundle as the others and nothing sat out. Against an aggregator that keeps a forged claim of round
2 for it (tests/runtime/forging_aggregator.py, ``past``), site-c refuses round 2 (FORGED) and keeps no bundle.
A round not kept is void or applied by the next kept round's signed model digest: withheld though applied, or gone
(more than 8 rounds ago), site-c sits out (``model-unchecked``), never splicing and never accusing; void, it catches
up across it (the red team's findings on branch redcatch, made regression tests).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.past_rounds import KEPT_ROUNDS
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.local.processes import Child
from fedfair.runtime.local.workspace import Workspace
from fedfair.runtime.output_folder import PAST_ROUNDS_NAME
from tests.runtime.harness import Processes, new_workspace

NAMES = ("site-a", "site-b", "site-c")
ROUNDS = 4
MISSED = 2
KILLED = f"before-upload:{MISSED}:STAGE_VERIFY_CLAIM"


def workspace_of(tmp_path: Path) -> Workspace:
    """Three sites, 4 rounds, every round waiting for all three (so round 3 waits for site-c's restart)."""
    return new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": ROUNDS, "server_momentum": 0.0, "local_steps": 1},
        quorum={"min_collaborators": 3, "round_timeout_seconds": 60.0},
    )


def outcome(workspace: Workspace, name: str) -> OutcomeRecord:
    config = workspace.configs[name]
    return OutcomeRecord(next(config.parent.glob(f"{name}.*.{OUTCOME_SUFFIX}")), 0)


def wait_for(child: Child, text: str, seconds: float) -> None:
    """Wait until `child` printed a line holding `text` (fails if it exits first or `seconds` pass)."""
    deadline = time.monotonic() + seconds
    while not any(text in line for line in child.lines):
        assert time.monotonic() < deadline and child.process.poll() is None, "\n".join(child.lines[-30:])
        time.sleep(0.5)


def restarted_site_c(processes: Processes, workspace: Workspace, attack: str) -> Child:
    """site-c started again after its kill in round 2, against the forging aggregator making `attack` of round 2."""
    processes.forging_aggregator(workspace, str(MISSED), attack)
    for name in NAMES[:2]:
        processes.collaborator(workspace, name)
    killed = processes.collaborator(workspace, "site-c", fault=KILLED)
    assert killed.wait(120) == -9, processes.tail()
    return processes.collaborator(workspace, "site-c")


def bundle_digest(workspace: Workspace, name: str) -> str:
    (bundle,) = workspace.configs[name].parent.glob(f"{name}.*.model_bundle.pt")
    return hashlib.sha256(bundle.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_site_killed_for_a_round_catches_up_and_ends_with_the_others(tmp_path: Path, processes: Processes) -> None:
    workspace = workspace_of(tmp_path)
    aggregator = processes.aggregator(workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES[:2]}
    killed = processes.collaborator(workspace, "site-c", fault=KILLED)
    assert killed.wait(120) == -9, processes.tail()
    sites["site-c"] = processes.collaborator(workspace, "site-c")
    assert aggregator.wait(240) == 0, processes.tail()
    log = read_round_log(workspace.output)
    assert [(record["round"], record["status"]) for record in log] == [(n, "applied") for n in range(1, ROUNDS + 1)]
    assert log[MISSED - 1]["contributors"] == list(NAMES), log[MISSED - 1]  # site-c masked its input, then died
    for record in log[MISSED:]:
        assert record["contributors"] == list(NAMES), record  # it rejoined at round 3 and trained every later round
    caught_up_with_the_others(processes, workspace, sites)


def caught_up_with_the_others(processes: Processes, workspace: Workspace, sites: Mapping[str, Child]) -> None:
    """Every site exits 0 having sat nothing out, site-c caught up on round MISSED alone, and all hold one bundle."""
    for name, site in sites.items():
        assert site.wait(60) == 0, processes.tail()
        kept = outcome(workspace, name)
        assert kept.refusal is None and kept.sat_out == {}, (name, kept.sat_out)
    said = [line for line in sites["site-c"].lines if "caught up" in line]
    assert len(said) == 1 and f"round {MISSED}: caught up" in said[0], said
    assert len({bundle_digest(workspace, name) for name in NAMES}) == 1  # the same file, byte for byte
    # Every site verified round 4 (the last), so no kept round is left for anyone.
    assert not any((workspace.output / PAST_ROUNDS_NAME).iterdir())


@pytest.mark.slow
def test_a_forged_round_it_missed_is_refused(tmp_path: Path, processes: Processes) -> None:
    workspace = workspace_of(tmp_path)
    restarted = restarted_site_c(processes, workspace, "past")
    assert restarted.wait(180) == 2, processes.tail()
    said = "\n".join(restarted.lines)
    assert f"aggregate-refused: round {MISSED}:" in said and "FORGED" in said, said[-3000:]
    record = outcome(workspace, "site-c")
    assert record.refusal is not None and (record.refusal.round, record.refusal.reason) == (MISSED, "FORGED")
    assert "is not the sum of the survivors' masked inputs" in record.refusal.detail
    assert not list(workspace.configs["site-c"].parent.glob("site-c.*model_bundle*"))


@pytest.mark.slow
def test_a_withheld_round_is_sat_out_not_spliced_past(tmp_path: Path, processes: Processes) -> None:
    """Round 2 applied, but the aggregator tells site-c it is not kept: site-c must not step round 3's sum onto round
    1's model (a model nobody held); round 3's signed model digest is none its chain made, so it sits out.

    Before the fix it logged "round 3: caught up" and then refused the federation's true round-4 model as a forgery
    (aggregate-refused, NEXT_MODEL). Now: model-unchecked, exit 2, no bundle, no refusal.
    """
    workspace = workspace_of(tmp_path)
    site_c = restarted_site_c(processes, workspace, "withhold")
    assert site_c.wait(240) == 2, processes.tail()
    said = "\n".join(site_c.lines)
    assert "aggregate-refused" not in said and "model-unchecked" in said, said[-3000:]
    assert not [line for line in site_c.lines if "caught up" in line], said[-3000:]
    assert "round 3: it ran on a model this site's chain did not make" in said, said[-3000:]
    record = outcome(workspace, "site-c")
    assert record.refusal is None and record.sat_out, (record.refusal, record.sat_out)
    assert not list(workspace.configs["site-c"].parent.glob("site-c.*model_bundle*"))


@pytest.mark.slow
def test_a_site_back_after_more_rounds_than_kept_sits_out_not_accusing(tmp_path: Path, processes: Processes) -> None:
    """Honest aggregator, quorum two: site-c, killed in round 2, is back once round 12 starts, when rounds 2 and 3
    are no longer kept (the newest 8 are). It cannot bridge to the kept rounds, so it ends model-unchecked.

    Before the fix it stepped the 8 kept rounds onto round 1's model and accused the honest aggregator
    (aggregate-refused, NEXT_MODEL) at the round it rejoined.
    """
    back_after = MISSED + KEPT_ROUNDS + 1  # round 11: rounds 2 and 3 are gone
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": 60, "server_momentum": 0.0, "local_steps": 1},  # two sites' rounds take ~0.2 s
        quorum={"min_collaborators": 2, "round_timeout_seconds": 30.0},
    )
    aggregator = processes.aggregator(workspace)
    for name in NAMES[:2]:
        processes.collaborator(workspace, name)
    killed = processes.collaborator(workspace, "site-c", fault=KILLED)
    assert killed.wait(120) == -9, processes.tail()
    wait_for(aggregator, f"round {back_after + 1} starts", 400)
    site_c = processes.collaborator(workspace, "site-c")
    code = site_c.wait(300)
    said = "\n".join(site_c.lines)
    assert aggregator.wait(120) == 0, processes.tail()
    assert "aggregate-refused" not in said, said[-3000:]
    assert code == 2 and "model-unchecked" in said, said[-3000:]
    assert not [line for line in site_c.lines if "caught up" in line], said[-3000:]
    # It asked once, found it could not bridge, and asked no more: one such line, not one per round it sat out.
    assert len([line for line in site_c.lines if "chain did not make" in line]) == 1, said[-3000:]


@pytest.mark.slow
def test_two_missed_rounds_across_a_void_one_are_caught_up(tmp_path: Path, processes: Processes) -> None:
    """Rounds 2 (applied), 3 (void once its sum verified, so not kept) and 4 (applied) run without site-c, back at 5.

    Round 4's signed model digest is that of round 2's step, so site-c knows round 3 was void by signed data: it
    catches up on 2, then on 4 from round 2's model, and ends with the others' bundle.
    """
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": 6, "server_momentum": 0.0, "local_steps": 1},
        # Two rounds without site-c (3 void, 4 without it) are within what every site accepts.
        quorum={"min_collaborators": 2, "round_timeout_seconds": 30.0, "aborted_rounds_allowed": 2},
    )
    aggregator = processes.forging_aggregator(workspace, str(MISSED), "void-next")
    for name in NAMES[:2]:
        processes.collaborator(workspace, name)
    killed = processes.collaborator(workspace, "site-c", fault=KILLED)
    assert killed.wait(120) == -9, processes.tail()
    wait_for(aggregator, "paused", 120)
    site_c = processes.collaborator(workspace, "site-c")
    processes.finish(aggregator, 300)
    statuses = [(record["round"], record["status"]) for record in read_round_log(workspace.output)]
    assert statuses[:4] == [(1, "applied"), (2, "applied"), (3, "aborted"), (4, "applied")], statuses
    caught = [line.split("site-c: ")[1].split(":")[0] for line in site_c.lines if "caught up" in line]
    assert caught == ["round 2", "round 4"], "\n".join(site_c.lines[-20:])
    assert len({bundle_digest(workspace, name) for name in NAMES}) == 1


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["older", "older-tags"])
def test_another_rounds_kept_inputs_are_refused_as_the_missed_rounds(
    tmp_path: Path, processes: Processes, attack: str
) -> None:
    """Round 1's kept inputs served as round 2's (all, or its claim and tags beside round 2's parameters): refused as
    round 2's (its parameters name another round, or the claim another session), never caught up on."""
    workspace = workspace_of(tmp_path)
    site_c = restarted_site_c(processes, workspace, attack)
    assert site_c.wait(180) == 2, processes.tail()
    said = "\n".join(site_c.lines)
    assert f"aggregate-refused: round {MISSED}:" in said and "MALFORMED" in said, said[-3000:]
    assert not [line for line in site_c.lines if "caught up" in line], said[-3000:]
    record = outcome(workspace, "site-c")
    assert record.refusal is not None and (record.refusal.round, record.refusal.reason) == (MISSED, "MALFORMED")
    assert not list(workspace.configs["site-c"].parent.glob("site-c.*model_bundle*"))


@pytest.mark.slow
def test_the_aggregator_killed_while_a_site_is_away_resumes_and_the_site_catches_up(
    tmp_path: Path, processes: Processes
) -> None:
    """Round 2's kept inputs outlive the aggregator's SIGKILL and --resume: site-c, back after it, catches up."""
    workspace = workspace_of(tmp_path)  # round 3 waits for site-c
    first = processes.aggregator(workspace)
    for name in NAMES[:2]:
        processes.collaborator(workspace, name)
    killed = processes.collaborator(workspace, "site-c", fault=KILLED)
    assert killed.wait(120) == -9, processes.tail()
    wait_for(first, "round 3: waiting for", 120)
    first.process.kill()
    assert first.wait(60) == -9
    resumed = processes.aggregator(workspace, "--resume")
    site_c = processes.collaborator(workspace, "site-c")
    processes.finish(resumed, 300)
    caught = [line for line in site_c.lines if "caught up" in line]
    assert len(caught) == 1 and f"round {MISSED}: caught up" in caught[0], "\n".join(site_c.lines[-20:])
