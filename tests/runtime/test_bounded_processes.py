"""A bounded federation as processes: an aggregator, three sites and the auditor over loopback mutual TLS (issue 80).

Every training round runs the bounded sum (the plan's input_bound = "two_verifiers", the manifest pinning the
auditor); the evaluation keeps the masked round. An honest federation applies every round. A site that lies (the
FEDFAIR_TEST_LIAR fault: its update 1.01, 2.5 or 3.5 times its bound, proven with a liar's witness) is excluded and
named at its first round, in the aggregator's round record and by every honest site's own check of the verdict
record, and the others' round applies, then every later one without it. An auditor started after the sites costs
no round: the aggregator waits for it as for its quorum. A round's record keeps the digest of its verdict record,
which each honest site logs beside the liar it names. Each accepted site verifies every round's bounded total
(VERIFY) and keeps its verdict record; its model chain steps the total, so it checks round 2's model and every
output model, and ends with round 2's sum verified.
"""

from __future__ import annotations

import hashlib
import sys
import tomllib
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.chain_record import CHAIN_SUFFIX, read_verdict
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.collaborator.kinds.bounded import LIAR_VARIABLE
from fedfair.runtime.local.forkserver import DISABLE
from fedfair.runtime.local.processes import (
    FEDFAIR_COMMAND,
    Child,
    child_environment,
    start_aggregator,
    start_collaborator,
)
from fedfair.runtime.local.workspace import Workspace, make_workspace
from tests.runtime.harness import Processes, eventually, plan_sections
from tests.runtime.test_verified_sums import FORGER

NAMES = ("site-a", "site-b", "site-c")
AUDITOR = "audit-co"
ROUNDS = 2
LENIENT_AUDITOR = Path(__file__).with_name("lenient_auditor.py")


def bounded_workspace(root: Path, **sections: Mapping[str, Any]) -> Workspace:
    """The local workspace with an auditor institution, a manifest pinning it and the plan, and the mode declared.

    fractional_bits 12: the workspace's declared weights (each site's batch) times update_norm, at 2^12, keep each
    bound within the proof's field. `sections` are more of the plan's (a quorum's timeout, privacy).
    """
    plan = plan_sections(
        **{
            "training": {"rounds": ROUNDS, "local_steps": 1},
            "quorum": {"min_collaborators": 2},
            "secure_aggregation": {"fractional_bits": 12},
            **sections,
        }
    )
    return make_workspace(root, NAMES, plan=plan, manifest=True, auditor=AUDITOR)


def start_auditor(
    processes: Processes,
    workspace: Workspace,
    *,
    lenient: bool = False,
    framing: bool = False,
    env: Mapping[str, str] | None = None,
) -> Child:
    """`fedfair auditor start` with the auditor's certificate, the manifest and the aggregator's address.

    `lenient`: the auditor without its floor on the inputs a total covers (tests/runtime/lenient_auditor.py);
    `framing`: the auditor moving its message about site-b (tests/runtime/forging_aggregator.py); `env` adds to its
    environment.
    """
    certs = workspace.certs
    if lenient:
        program = [sys.executable, str(LENIENT_AUDITOR)]
    elif framing:
        program = [sys.executable, str(FORGER), "--framing-auditor"]
    else:
        program = [*FEDFAIR_COMMAND, "auditor", "start"]
    command = [
        *program,
        "--cert",
        str(certs / f"{AUDITOR}.crt"),
        "--key",
        str(certs / f"{AUDITOR}.key"),
        "--ca",
        str(certs / "ca.crt"),
        "--manifest",
        str(workspace.root / "manifest.toml"),
        "--aggregator",
        workspace.address,
        "--folder",
        str(workspace.root / AUDITOR),
    ]
    child = Child(AUDITOR, command, env=child_environment(env), sink=processes.log)
    processes.children.append(child)
    return child


def every_round_applied(processes: Processes, workspace: Workspace) -> list[dict[str, Any]]:
    """Run `workspace`'s aggregator, auditor and sites to the end; every round applied with every site: its log."""
    aggregator = processes.aggregator(workspace)
    auditor = start_auditor(processes, workspace)
    for name in NAMES:
        processes.collaborator(workspace, name)
    processes.finish(aggregator)
    assert auditor.wait(60) == 0, processes.tail()
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied"] * ROUNDS, processes.tail()
    assert all(sorted(record["contributors"]) == list(NAMES) for record in log), log
    return log


@pytest.mark.slow
def test_an_honest_bounded_federation_applies_every_round(tmp_path: Path, processes: Processes) -> None:
    workspace = bounded_workspace(tmp_path)
    log = every_round_applied(processes, workspace)
    assert not any(record.get("excluded") for record in log), log
    for name in NAMES:
        checked_every_round(workspace, name, log)


def framed_and_cleared(
    processes: Processes, workspace: Workspace, sites: Mapping[str, Child], framed: str, framed_said: str = ""
) -> None:
    """The aggregator framed `framed` in round 1 and every site (`sites`) cleared it: each stopped naming the
    aggregator (FRAMED, exit 2), `framed` having sent its part back as its dispute (its log also saying
    `framed_said`), the others having checked that dispute; no site names `framed` a liar, none applied the round,
    and the aggregator's round record does not exclude it."""
    for name, site in sites.items():
        assert site.wait(240) == 2, (name, processes.tail())
        said = "\n".join(site.lines)
        assert "aggregate-refused: round 1:" in said and "FRAMED" in said, (name, said[-3000:])
        if name == framed:
            assert framed_said in said and "this site sent that part back as its dispute" in said, said[-3000:]
        else:
            assert f"the aggregator framed {framed}, whose proof checks with the true message" in said, said[-3000:]
        assert f"the verdict record names {framed}" not in said, (name, said[-3000:])
        folder = workspace.configs[name].parent
        (record,) = (OutcomeRecord(path, 0) for path in folder.glob(f"{name}.*.{OUTCOME_SUFFIX}"))
        assert record.liars == (), (name, record.liars)
        assert record.refusal is not None and (record.refusal.round, record.refusal.reason) == (1, "FRAMED"), name
    log = read_round_log(workspace.output)
    assert not [record for record in log if record["status"] == "applied"], log
    assert not [record for record in log if framed in record.get("excluded", {})], log


def checked_every_round(workspace: Workspace, name: str, log: list[dict[str, object]]) -> None:
    """`name` kept each round's verdict record (the one whose digest the round's record names), and its model chain
    verified the last round's bounded total and stepped it: it checked round 2's model, made of round 1's total."""
    folder = workspace.configs[name].parent
    federation = tomllib.loads(workspace.plan.read_text())["federation"]["id"]
    for record in log:
        kept = folder / f"{name}.{federation}.round-{record['round']}.verdict_record"
        assert kept.exists(), (name, sorted(path.name for path in folder.iterdir()))
        assert hashlib.sha256(kept.read_bytes()).hexdigest() == record["verdict_record_sha256"], (name, record)
    anchor = read_verdict(folder / f"{name}.{federation}.{CHAIN_SUFFIX}")
    assert anchor.round == ROUNDS and anchor.verified and anchor.stepped and not anchor.void, name


@pytest.mark.slow
def test_the_first_round_compiles_nothing_and_costs_about_a_later_one(tmp_path: Path, processes: Processes) -> None:
    """Issue 94's stall: numba compiles the proof's arithmetic at its first call, and every site called it first at
    round 1's SHARE (the auditor at its first stages), so round 1 waited about 30 s here (110 s on a busier machine)
    while every log said it waited for another party. Each party now compiles before its first round. With numba's
    cache empty (every party compiles, as on a machine's first run), round 1's SHARE takes at most 3 times the
    slowest later one plus 1 s: what is left of a first call (the first training step, the first proof's buffers)
    measured 0.1 to 1.6 s on a busy 2-core machine; compiling takes 20 s of a core per party."""
    rounds = 4
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba"), DISABLE: "0"}  # executed afresh: numba reads it at import
    workspace = bounded_workspace(tmp_path, training={"rounds": rounds, "local_steps": 1})
    aggregator = start_aggregator(workspace, env=env, sink=processes.log)
    processes.children.append(aggregator)
    start_auditor(processes, workspace, env=env)
    for name in NAMES:
        processes.children.append(start_collaborator(workspace, name, env=env, sink=processes.log))
    processes.finish(aggregator, timeout=600)
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied"] * rounds, processes.tail()
    for party in (*NAMES, AUDITOR, "aggregator"):
        assert f"{party}: the bounded sum's arithmetic is ready" in processes.log.getvalue(), (party, processes.tail())
    share = [record["stage_seconds"]["STAGE_BOUNDED_SHARE"] for record in log]
    assert share[0] <= 3 * max(share[1:]) + 1.0, share


@pytest.mark.slow
def test_a_forged_bounded_total_is_refused_by_every_site_naming_the_round(tmp_path: Path, processes: Processes) -> None:
    """The aggregator moves its share-sum in round 2's total (tests/runtime/forging_aggregator.py, ``bounded``), applies
    it and relays the tags without its own check: every site refuses round 2's total (FORGED) and stops."""
    workspace = bounded_workspace(tmp_path)
    aggregator = Child(
        "aggregator",
        [sys.executable, str(FORGER), str(workspace.plan), str(ROUNDS), "bounded"],
        env=child_environment(),
        sink=processes.log,
        watch="listening on port",
    )
    processes.children.append(aggregator)
    assert aggregator.seen.wait(120) and aggregator.process.poll() is None, processes.tail()
    start_auditor(processes, workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES}
    for name, site in sites.items():
        assert site.wait(240) == 2, (name, processes.tail())
        said = "\n".join(site.lines)
        assert f"aggregate-refused: round {ROUNDS}:" in said and "FORGED" in said, (name, said[-3000:])
        assert "tags and the auditor's do not add up to the record's total" in said, (name, said[-3000:])
    first = read_round_log(workspace.output)[0]
    assert first["round"] == 1 and first["status"] == "applied", first


@pytest.mark.slow
def test_an_auditor_started_after_the_sites_costs_no_round(tmp_path: Path, processes: Processes) -> None:
    workspace = bounded_workspace(tmp_path)
    aggregator = processes.aggregator(workspace)
    for name in NAMES:
        processes.collaborator(workspace, name)
    # The aggregator says it waits for the auditor (a report every WAIT_REPORT_SECONDS) before the auditor starts.
    assert eventually(lambda: any("waiting for the auditor" in line for line in aggregator.lines), 120), (
        processes.tail()
    )
    auditor = start_auditor(processes, workspace)
    processes.finish(aggregator)
    assert auditor.wait(60) == 0, processes.tail()
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied"] * ROUNDS, processes.tail()
    assert all(sorted(record["contributors"]) == list(NAMES) for record in log), log


@pytest.mark.slow
@pytest.mark.parametrize("factor", [1.01, 2.5, 3.5])
def test_a_liar_is_excluded_and_named_at_its_first_round_and_the_others_rounds_apply(
    tmp_path: Path, processes: Processes, factor: float
) -> None:
    liar, honest = "site-b", ("site-a", "site-c")
    workspace = bounded_workspace(tmp_path)
    aggregator = processes.aggregator(workspace)
    start_auditor(processes, workspace)
    sites = {name: processes.collaborator(workspace, name) for name in honest}
    lying = start_collaborator(workspace, liar, env={LIAR_VARIABLE: str(factor)}, sink=processes.log)
    processes.children.append(lying)
    assert aggregator.wait(300) == 0, processes.tail()
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied"] * ROUNDS, processes.tail()
    first = log[0]
    assert sorted(first["contributors"]) == list(honest), first
    assert list(first.get("excluded", {})) == [liar] and "norm" in first["excluded"][liar], first
    assert all(sorted(record["contributors"]) == list(honest) for record in log[1:]), log
    # The round's record keeps the digest of the verdict record that proved the liar, as every site received it.
    digest = first["verdict_record_sha256"]
    assert len(digest) == 64, first
    for name, site in sites.items():
        assert site.wait(60) == 0, processes.tail()
        said = [line for line in site.lines if f"the verdict record names {liar}" in line]
        assert said and "round 1" in said[0] and f"sha256 {digest}" in said[0], (name, processes.tail())
        checked_every_round(workspace, name, log)
        # Named in the site's own outcome record too, with the digest of the record that proved it and the kept file.
        folder = workspace.configs[name].parent
        (liars,) = {OutcomeRecord(path, 0).liars for path in folder.glob(f"{name}.*.{OUTCOME_SUFFIX}")}
        assert [(entry.round, entry.party, entry.record_sha256) for entry in liars] == [(1, liar, digest)], liars
        assert "norm" in liars[0].reasons and (folder / liars[0].kept).exists(), liars


def forging_aggregator(processes: Processes, workspace: Workspace, attack: str) -> Child:
    """The forging aggregator making `attack` (one-share, one-share-to-all, frame) from round 1 on."""
    aggregator = Child(
        "aggregator",
        [sys.executable, str(FORGER), str(workspace.plan), "1", attack],
        env=child_environment(),
        sink=processes.log,
        watch="listening on port",
    )
    processes.children.append(aggregator)
    assert aggregator.seen.wait(120) and aggregator.process.poll() is None, processes.tail()
    return aggregator


@pytest.mark.slow
def test_an_aggregator_that_keeps_one_sites_share_gets_no_total_from_the_auditor(
    tmp_path: Path, processes: Processes
) -> None:
    """Issue 93: the aggregator keeps only site-a's share (threshold 2 of 3): the auditor withdraws at TOTAL naming the
    round and the floor, so no sum of site-a alone is formed, no site is sent a record, and no round is applied."""
    workspace = bounded_workspace(tmp_path)
    forging_aggregator(processes, workspace, "one-share")
    auditor = start_auditor(processes, workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES}
    refused = "round 1 STAGE_BOUNDED_TOTAL: withdrawing from the round: BELOW_FLOOR"
    assert eventually(lambda: any(refused in line for line in auditor.lines), 240), processes.tail()
    said = next(line for line in auditor.lines if refused in line)
    assert "covers 1 accepted input(s)" in said and "fewer than the plan's threshold of 2" in said, said
    for name, site in sites.items():
        assert site.wait(300) != 0, (name, processes.tail())
    assert not [record for record in read_round_log(workspace.output) if record["status"] == "applied"]


@pytest.mark.slow
def test_a_total_of_one_sites_share_signed_by_a_lenient_auditor_is_refused_by_every_site(
    tmp_path: Path, processes: Processes
) -> None:
    """Issue 93: the aggregator keeps only site-a's share, drops its own floor and sends the record to every site, and
    the auditor signs without its floor: each site's own check refuses the record (BELOW_FLOOR, exit 2) naming
    round 1, tags nothing and applies nothing."""
    workspace = bounded_workspace(tmp_path)
    forging_aggregator(processes, workspace, "one-share-to-all")
    start_auditor(processes, workspace, lenient=True)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES}
    for name, site in sites.items():
        assert site.wait(240) == 2, (name, processes.tail())
        said = "\n".join(site.lines)
        assert "aggregate-refused: round 1:" in said and "BELOW_FLOOR" in said, (name, said[-3000:])
        assert "covers 1 accepted input(s)" in said and "threshold of 2" in said, (name, said[-3000:])
        folder = workspace.configs[name].parent
        (record,) = (OutcomeRecord(path, 0) for path in folder.glob(f"{name}.*.{OUTCOME_SUFFIX}"))
        assert record.refusal is not None and (record.refusal.round, record.refusal.reason) == (1, "BELOW_FLOOR")
        assert not any(folder.glob("*model_bundle*")), name  # it keeps no model of this federation
    assert not [record for record in read_round_log(workspace.output) if record["status"] == "applied"]


@pytest.mark.slow
def test_an_aggregator_that_frames_an_honest_site_is_named_at_every_site_and_the_site_is_no_liar(
    tmp_path: Path, processes: Processes
) -> None:
    """Issue 94: the aggregator moves its own verifier message about honest site-b (forging_aggregator.py, ``frame``),
    so the verdict record's evidence, signed by both verifiers, names site-b a liar. Site-b checks that evidence
    against the part it sent: the aggregator's message is not the one the part gives, so it sends the part back as its
    dispute and stops naming the aggregator (FRAMED, exit 2), not as a liar (exit 3). Every accepted site is shown the
    dispute at VERIFY, checks it and stops naming the aggregator (FRAMED); no site names site-b a liar, none applies the
    round, and the aggregator's round record does not exclude site-b."""
    framed = "site-b"
    workspace = bounded_workspace(tmp_path)
    forging_aggregator(processes, workspace, "frame")
    start_auditor(processes, workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES}
    framed_and_cleared(processes, workspace, sites, framed)
    for name in NAMES:
        assert not any(workspace.configs[name].parent.glob("*model_bundle*")), name


@pytest.mark.slow
def test_an_auditor_that_frames_a_site_is_named_by_that_site_alone(tmp_path: Path, processes: Processes) -> None:
    """Issue 94's limit: the auditor moves its own verifier message about honest site-b. Site-b finds the auditor's
    message, signed under the record's query seed, is not the one its share for the auditor gives under that seed and
    stops naming the auditor alone (FRAMED, exit 2); it shows nobody, as showing it would take that share, which with
    the aggregator's part is its update. The others cannot tell it from a liar: they name site-b a liar and their
    rounds apply without it (docs/security.md, "A framed site")."""
    framed, honest = "site-b", ("site-a", "site-c")
    workspace = bounded_workspace(tmp_path)
    aggregator = processes.aggregator(workspace)
    start_auditor(processes, workspace, framing=True)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES}
    assert sites[framed].wait(240) == 2, processes.tail()
    said = "\n".join(sites[framed].lines)
    assert (
        "aggregate-refused: round 1:" in said
        and "FRAMED" in said
        and "which the auditor signed it under: the auditor framed it" in said
        and "or the aggregator wrote" not in said
    ), said[-3000:]
    assert aggregator.wait(300) == 0, processes.tail()
    log = read_round_log(workspace.output)
    assert [record["status"] for record in log] == ["applied"] * ROUNDS, processes.tail()
    assert list(log[0].get("excluded", {})) == [framed], log[0]
    for name in honest:
        assert sites[name].wait(60) == 0, processes.tail()
        assert any(f"the verdict record names {framed}" in line for line in sites[name].lines), processes.tail()


@pytest.mark.slow
def test_an_aggregator_that_writes_a_false_query_seed_is_named_by_every_site(
    tmp_path: Path, processes: Processes
) -> None:
    """Red team of issue 94: the aggregator writes another query seed in round 1's record, its own messages recomputed
    and signed under it, and honest site-b excluded (forging_aggregator.py, ``false-seed``). The auditor signed its
    messages under the seed both verifiers drew, so every site refuses the record naming the aggregator (FORGED,
    exit 2): site-b does not suspect the auditor, and no site names site-b a liar."""
    framed = "site-b"
    workspace = bounded_workspace(tmp_path)
    forging_aggregator(processes, workspace, "false-seed")
    start_auditor(processes, workspace)
    sites = {name: processes.collaborator(workspace, name) for name in NAMES}
    for name, site in sites.items():
        assert site.wait(240) == 2, (name, processes.tail())
        said = "\n".join(site.lines)
        assert "aggregate-refused: round 1:" in said and "FORGED" in said, (name, said[-3000:])
        assert "the aggregator's record is false" in said, (name, said[-3000:])
        assert "not signed by the auditor under this query seed" in said, (name, said[-3000:])
        assert "the auditor framed it" not in said, (name, said[-3000:])
        assert f"the verdict record names {framed}" not in said, (name, said[-3000:])
