"""The attack suite (benchmarks/attack_matrix.py): its quick run, and the two promises it rests on.

- The hostile side is code that is not ours: its modules import only the generated
  protobuf/gRPC modules, grpc, cryptography, numpy and the standard library.
- Its hand-written secure-aggregation payloads are the protocol's: fedfair's own server
  accepts a genuine advertisement, a signed garbage ShareKeys and a ShareCheck made by
  it, and its session id is the server's. Otherwise a forged message could be refused
  for being stale rather than for being forged, and a row would pass for the wrong reason.
- The quick run (a real aggregator process, real TLS, honest collaborators, the hostile
  client, 500 fuzz messages, one crash point), in groups of scenarios: every row handled, the Report RPC's
  abuse rows among them, the consent scenario's (factory, bundle, differencing,
  unpinned plan, survivor floor, statistics, evaluation query) and the influence scenario's
  (liar weight, dp weight) and the record scenario's (re-run, 1-ulp push, lost record, 2 GiB announced,
  TRAIN flood) and the outcome scenario's (forged, tampered, substituted and honest final bundle) too, the fuzz clean.
  `make test` runs the transport group (the hostile client's own attacks and the fuzz); the other groups re-run
  the campaign's federations and are marked `study` (`make test-studies`).
- The noise scenario alone (``--only noise``, issues 41 and 65, about 25 s): every row handled, each stating the
  noise scale the aggregator faces and the epsilon each site's ledger charged, and each measured error
  of that noise's order (nothing exact), its control without [privacy] exact; a forged model in those rows
  refused by every site it is sent to (NEXT_MODEL). It re-runs the campaign's federations too, so it is
  marked `study`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.runtime.contract import TRAINING, RoundParameters
from fedfair.secagg import Client, Server, messages
from fedfair.secagg.masked_round import SECURE_ROUND

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
HOSTILE_MODULES = ("hostile_client", "secagg_wire", "fuzz", "fuzz_mutations", "rows")
ALLOWED_PACKAGES = {"grpc", "cryptography", "numpy"}
GENERATED = {"fedfair.runtime.transport.fedfair_pb2", "fedfair.runtime.transport.fedfair_pb2_grpc"}

sys.path.insert(0, str(BENCHMARKS))
from attacks import secagg_wire

FEDERATION = "attack-test"
NAMES = ("site-a", "site-b", "site-m")
CONSENT_CLASSES = {
    "factory": 2,
    "bundle": 1,
    "differencing": 1,
    "unpinned plan": 1,
    "survivor floor": 1,
    "statistics": 1,
    "evaluation query": 1,
    "liar weight": 2,
    "dp weight": 2,
    "re-run": 1,
    "1-ulp push": 1,
    "lost record": 1,
    "2 GiB announced": 1,
    "TRAIN flood": 1,
    "noise floor": 1,
    "odd plan values": 1,
    "odd plan served": 2,
    "evaluation schedule": 1,
    "refusal flood": 1,
    "renewal": 1,
    "revoked site": 1,
    "edited ledger": 1,
    "forged bundle": 1,
    "tampered bundle": 1,
    "substituted output model": 1,
    "honest bundle (the control)": 1,
    "final evaluation asked twice": 1,
    "forged next model (backdoor)": 1,
    "forged next model (flip)": 1,
    "revoked key mid-run": 1,
    "key rotation mid-run": 1,
    "broken chain (a backdoored initial model)": 1,
    "broken chain (a skipped round then a forged model)": 1,
    "broken chain (every site restarted then a forged model)": 1,
    "forged evaluation sum": 1,
    "forged evaluation figure": 1,
    "colluding survivor": 1,
    "bounded floor": 2,
}
"""The consent, influence, record and plan scenarios' row classes (each row's attack text starts with its class
word) and how many rows each."""


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, absolute names (``from p import m`` counts as ``p.m`` and ``p``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_the_hostile_side_imports_only_the_schema_and_public_libraries() -> None:
    for module in HOSTILE_MODULES:
        imports = imported_modules(BENCHMARKS / "attacks" / f"{module}.py")
        hostile = tuple(f"attacks.{other}" for other in HOSTILE_MODULES)
        foreign = {
            name
            for name in imports
            if name.split(".")[0] not in ALLOWED_PACKAGES | set(sys.stdlib_module_names)
            and name not in GENERATED
            and name != "attacks"
            and not name.startswith(tuple(f"{other}." for other in hostile))
            and name not in hostile
            # `from fedfair.runtime.transport import fedfair_pb2` names the package only to reach the module
            and not (name == "fedfair.runtime.transport" and imports & GENERATED)
        }
        assert not foreign, f"attacks/{module}.py imports {sorted(foreign)}"


def test_the_hostile_encoding_is_the_protocol(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    pki.init_ca(certs)
    for name in NAMES:
        pki.issue(certs, "collaborator", name)
    ca = pki.load_certificate(certs / "ca.crt")
    verify = pki.credential_verifier(ca, "collaborator")
    # As the aggregator announces them at ADVERTISE (JSON); from_bytes takes the keys its version knows.
    announced = {
        "kind": "train",
        "round": 3,
        "secure": True,
        "parties": list(NAMES),
        "dimension": 11,
        "encoding": {"clip": 10.0, "max_weight": 1e6, "fractional_bits": 20, "modulus_bits": 64},
        "threshold": None,
        "neighbours": None,
        "max_colluding": 0,
        "graph_roster": sorted(NAMES),
        "graph_seed": "",
        "model": hashlib.sha256(b"the round's model").hexdigest(),  # binds the session to the model sent
        "protocol": SECURE_ROUND.name,  # the masked round, not the bounded one
        "identities": [],
    }
    for colluding in (1, 0):  # the last one runs the protocol below
        announced["max_colluding"] = colluding
        parameters = RoundParameters.from_bytes(json.dumps(announced).encode())
        config = parameters.secagg_config(FEDERATION, TRAINING)
        info = secagg_wire.RoundInfo.parse(FEDERATION, parameters.to_bytes())
        assert (info.session_round, info.t, info.config_digest()) == (config.round, config.t, config.digest)

    server = Server(config, verify)
    honest = []
    for name in NAMES[:2]:
        key = pki.load_private_key(certs / f"{name}.key")
        credential = pki.load_certificate(certs / f"{name}.crt").public_bytes(serialization.Encoding.DER)
        client = Client(config, name, key, credential, verify)
        server.receive_advertisement(client.advertise())
        honest.append(client)
    me = info.party_id("site-m")
    signer = secagg_wire.load_identity_key((certs / "site-m.key").read_bytes())
    credential = secagg_wire.certificate_der((certs / "site-m.crt").read_bytes())
    keys = secagg_wire.RoundKeys.fresh()
    server.receive_advertisement(
        messages.AdvertiseKeys.from_bytes(secagg_wire.advertisement(info, me, keys, credential, signer))
    )

    directory = server.key_directory()
    listed = secagg_wire.parse_key_directory(directory.to_bytes())
    assert sorted(entry.sender for entry in listed) == [1, 2, 3]
    session = secagg_wire.session_id(info.config_digest(), listed)
    assert session == server.session_id
    for client in honest:
        server.receive_shares(client.share_keys(directory))
    garbage = secagg_wire.share_keys(info, session, me, [1, 2], signer, lambda _: os.urandom(100))
    server.receive_shares(messages.ShareKeys.from_bytes(garbage))  # signed entries: taken as the protocol's
    server.share_bundles()
    check = secagg_wire.share_check(info, session, me, [], signer)
    server.receive_share_check(messages.ShareCheck.from_bytes(check))


QUICK_GROUPS: dict[str, tuple[tuple[str, ...], dict[str, int], int]] = {
    "transport": (("plain",), {}, 12),
    "protocol": (
        ("secure", "cheating", "consent", "influence"),
        {
            word: CONSENT_CLASSES[word]
            for word in (
                "factory",
                "bundle",
                "differencing",
                "unpinned plan",
                "survivor floor",
                "statistics",
                "evaluation query",
                "liar weight",
                "dp weight",
                "forged next model (backdoor)",
                "forged next model (flip)",
            )
        },
        12,
    ),
    "crashes": (("crashes",), {}, 1),
    "chain": (
        ("chain",),
        {word: CONSENT_CLASSES[word] for word in CONSENT_CLASSES if word.startswith("broken chain")},
        3,
    ),
    "figures": (
        ("figures",),
        {word: CONSENT_CLASSES[word] for word in ("forged evaluation sum", "forged evaluation figure")},
        2,
    ),
    "colluding": (("colluding",), {"colluding survivor": CONSENT_CLASSES["colluding survivor"]}, 1),
    "bounded": (("bounded",), {"bounded floor": CONSENT_CLASSES["bounded floor"]}, 2),
    "waits": (("waits",), {}, 2),
    "record": (
        ("record",),
        {
            word: CONSENT_CLASSES[word]
            for word in ("re-run", "1-ulp push", "lost record", "2 GiB announced", "TRAIN flood")
        },
        5,
    ),
    "plan": (
        ("plan",),
        {word: CONSENT_CLASSES[word] for word in ("noise floor", "odd plan values", "odd plan served")},
        4,
    ),
    "schedule": (("schedule",), {word: CONSENT_CLASSES[word] for word in ("evaluation schedule", "refusal flood")}, 2),
    "ledger": (("ledger",), {word: CONSENT_CLASSES[word] for word in ("renewal", "revoked site", "edited ledger")}, 3),
    "outcome": (
        ("outcome",),
        {
            word: CONSENT_CLASSES[word]
            for word in ("forged bundle", "tampered bundle", "substituted output model", "honest bundle (the control)")
        },
        4,
    ),
    "repeat_model": (
        ("repeat_model",),
        {"final evaluation asked twice": CONSENT_CLASSES["final evaluation asked twice"]},
        1,
    ),
    "rotation": (
        ("rotation", "leaving"),
        {word: CONSENT_CLASSES[word] for word in ("revoked key mid-run", "key rotation mid-run")},
        3,
    ),
}
"""The quick run in groups of scenarios, each its own test so the suite's workers share them: the scenarios,
the row classes each group must hold (with how many rows), and the fewest rows the group yields. Together
they cover every scenario but noise and full_disk, which have their own tests below."""

IN_MAKE_TEST = "transport"
"""The group `make test` runs: the hostile client's own attacks on transport, identity, plain updates, the
Report RPC and the fuzz, about 12 CPU-seconds. The other groups re-run the campaign's federations (10 to 50
CPU-seconds each, 220 together) and are marked `study`: `make test-studies` runs them. Each defence they
attack also has its own test in the suite (tests/runtime: renewal, revocation, resume, the final bundle, ...)."""


def run_matrix(
    scenarios: tuple[str, ...], out: Path, *, quick: bool = True, timeout: float = 300, prefix: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Run the attack matrix over `scenarios` (its quick version unless `quick` is False), its command line after
    `prefix`, and return its JSON."""
    only = [word for scenario in scenarios for word in ("--only", scenario)]
    quick_flag = ["--quick"] if quick else []
    completed = subprocess.run(
        [*prefix, sys.executable, str(BENCHMARKS / "attack_matrix.py"), *quick_flag, *only, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_the_quick_groups_cover_every_scenario_and_row_class() -> None:
    tree = ast.parse((BENCHMARKS / "attack_matrix.py").read_text())  # read, not imported: no torch here
    assigned = (
        node for node in tree.body if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "SCENARIOS"
    )
    scenarios = ast.literal_eval(next(assigned).value)
    grouped = [scenario for scenarios, _, _ in QUICK_GROUPS.values() for scenario in scenarios]
    assert sorted(grouped) == sorted(set(scenarios) - {"noise", "full_disk"}) and len(grouped) == len(set(grouped))
    assert {word for _, classes, _ in QUICK_GROUPS.values() for word in classes} == set(CONSENT_CLASSES)


@pytest.mark.slow
@pytest.mark.parametrize(
    "group", [pytest.param(group, marks=() if group == IN_MAKE_TEST else pytest.mark.study) for group in QUICK_GROUPS]
)
def test_the_quick_attack_matrix_finds_every_attack_handled(tmp_path: Path, group: str) -> None:
    """Up to a minute and a half per group: a real federation on loopback, attacked by the hostile client
    (see the script). Only IN_MAKE_TEST's group runs in `make test`; `make test-studies` runs the others."""
    scenarios, classes, fewest = QUICK_GROUPS[group]
    result = run_matrix(scenarios, tmp_path / "attacks.json")
    rows = result["attacks"]
    assert isinstance(rows, list) and len(rows) >= fewest
    failed = {row["attack"]: row["observed"] for row in rows if not row["handled"]}
    assert not failed, json.dumps(failed, indent=1)
    # Consent and pins: a factory in the plan (pinned and roster-only manifests), a factory bundle,
    # differencing across rounds and restarts, a plan unlike the pin, a survivor set below the floor,
    # the statistics sum (small cells, round 0 re-run without a site) and the evaluation query (a
    # served grid, the same crafted model evaluated without a site); influence and the record too.
    for word, least in classes.items():
        matching = [row for row in rows if row["attack"].startswith(f"{word}:")]
        assert len(matching) >= least, f"{len(matching)} '{word}' rows, expected at least {least}"
        assert all(row["handled"] for row in matching), json.dumps(matching, indent=1)
    if "plain" in scenarios:
        # The Report RPC is abused too (malformed, foreign, out of range, flooded), and fuzzed.
        assert sum(row["attack"].startswith("Report") for row in rows) >= 12
        fuzz = result["fuzz"]
        assert isinstance(fuzz, dict) and fuzz["messages"] >= 500
        assert fuzz["by_rpc"].get("Report"), fuzz["by_rpc"]
        assert (fuzz["crashes"], fuzz["hangs"], fuzz["invalid_rounds_applied"]) == (0, 0, 0), fuzz


NOISE_ROWS = ("evaluation", "1-ulp difference", "composition", "training differencing")
"""The noise scenario's rows, by the words after "noise, " in their attack text."""


@pytest.mark.study
def test_under_privacy_every_query_the_aggregator_decodes_is_noised(tmp_path: Path) -> None:
    """About 25 s: the noise scenario alone (real federations on loopback: the attacks, forged and curious, and
    their controls)."""
    result = run_matrix(("noise",), tmp_path / "noise.json", quick=False, timeout=120)
    rows = {row["attack"].split(":")[0]: row for row in result["attacks"]}
    assert sorted(rows) == sorted(f"noise, {name}" for name in NOISE_ROWS), json.dumps(rows, indent=1)[:3000]
    failed = {name: row["observed"] for name, row in rows.items() if not row["handled"]}
    assert not failed, json.dumps(failed, indent=1)
    details = {name.removeprefix("noise, "): row["details"] for name, row in rows.items()}
    # Since issue 79 a site evaluates only a model its chain made: the crafted model and its one-ulp twin are sat
    # out by every site, so nothing of them is decoded or charged (each row's own ledger folder: no other run's).
    for name in ("evaluation", "1-ulp difference"):
        assert details[name]["refused_outright"] is True, json.dumps(details[name], indent=1)[:2000]
    assert all(entry["releases"] == [] for entry in details["evaluation"]["ledger"].values())
    assert set(details["1-ulp difference"]["epsilon"].values()) == {0.0}
    # The evaluation the chain lets through (the verified output model) is decoded noised, errors of the noise's
    # order, not exact, and each site charged its statistics and that one answer.
    composition = details["composition"]
    assert composition["composition"]["noise_std"] > 1.0
    assert 0.3 < composition["composition"]["counts"]["rms_in_std"] < 3.0
    assert composition["composition"]["counts"]["exact_share"] < 0.5
    assert all(entry["releases"] == [["statistics", 0], ["evaluate", 3]] for entry in composition["ledger"].values())
    assert all(entry["epsilon"] > 0 for entry in composition["ledger"].values())
    # A forged model (a c of the aggregator's choosing, a model one ulp away) is refused by every site it is sent
    # to, for the model chain's reason, before anything is counted or trained on it.
    refused = composition["forged"]["refusals"]
    assert len(refused) == 4 and {reason for _, reason in refused.values()} == {"NEXT_MODEL"}
    assert composition["forged"]["sums_decoded"] == 0
    training = details["training differencing"]
    sent_the_forgery = sorted(name for name, refusal in training["forged"]["refusals"].items() if refusal)
    assert sent_the_forgery == ["site-a", "site-b", "site-c"]  # site-d, the victim, was left out of round 2
    assert training["forged"]["trained_in_round_2"] == [] and not training["forged"]["round_2_decoded"]
    # Curious only: the noise hides the victim; without it the decoded difference is the sites' own to the rounding.
    assert training["attack"]["std"] > 0
    assert training["full_batches"]["largest_departure"] <= training["full_batches"]["rounding_bound"]
    # Every site's ledger charged what it trained: two rounds cost more than one, and nothing is free.
    spent = {name: entry["epsilon"] for name, entry in training["ledger"].items()}
    assert spent["site-a"] > spent["site-d"] > 0


FULL_DISK_ROWS = ("full disk", "full disk, restarted with room")
"""The full_disk scenario's rows, by their attack text's words before the colon."""

OWN_MOUNTS = ("unshare", "--user", "--map-root-user", "--mount")
"""A command's prefix that runs it as root of a user and mount namespace of its own, where it may mount a tmpfs."""


def own_mounts() -> tuple[str, ...]:
    """:data:`OWN_MOUNTS` where this process may not mount (not root) and the kernel lends such namespaces; else ()."""
    if os.geteuid() == 0 or shutil.which("unshare") is None:
        return ()
    probe = subprocess.run([*OWN_MOUNTS, "true"], capture_output=True, check=False)
    return OWN_MOUNTS if probe.returncode == 0 else ()


@pytest.mark.slow
@pytest.mark.study
def test_a_full_disk_under_a_collaborator_is_named_and_it_rejoins_with_room(tmp_path: Path) -> None:
    """About 20 s: the full_disk scenario alone (a real federation, site-c's folder a tmpfs filled after round 2).
    Not root, it runs in a user and mount namespace of its own where the kernel lends one; where no tmpfs can be
    mounted even so, the scenario skips its rows with the reason, and so does this test."""
    result = run_matrix(("full_disk",), tmp_path / "full_disk.json", quick=False, timeout=600, prefix=own_mounts())
    rows = {row["attack"].split(":")[0]: row for row in result["attacks"]}
    assert sorted(rows) == sorted(FULL_DISK_ROWS), json.dumps(rows, indent=1)[:3000]
    skipped = sorted({row["skipped"] for row in rows.values() if "skipped" in row})
    if skipped:
        pytest.skip(f"the full_disk scenario skipped its rows: {skipped}")
    failed = {name: row["observed"] for name, row in rows.items() if not row["handled"]}
    assert not failed, json.dumps(failed, indent=1)
    # What the rows stand on, read from their details: the records held the rounds before the fill, and every
    # process of the federation ended alike (0, or 3 when the round site-c left aborted).
    state = rows["full disk"]["details"]["state"]
    assert state["temporary_files"] == [] and state["bindings"] == "read back" and state["rounds_held"] >= 2
    statuses = rows["full disk, restarted with room"]["details"]["exit_statuses"]
    assert len(statuses) == 4 and len(set(statuses.values())) == 1 and set(statuses.values()) <= {0, 3}


def test_a_partial_run_replaces_only_the_rows_it_measured() -> None:
    import attack_matrix  # the script's module, on the benchmarks path above

    def row(attack: str, handled: bool) -> dict[str, object]:
        return {"attack": attack, "expected": "", "observed": "", "handled": handled, "seconds": 1.0, "method": "m"}

    earlier = {
        "attacks": [row("a", True), row("b", False)],
        "scenario_seconds": {"plain": 5.0},
        "failed": ["b"],
        "provenance": {"command": "full run", "date": "2026-01-01"},
    }
    skipped = {**row("d", False), "skipped": "cannot mount a tmpfs here"}  # neither handled nor failed
    run = {"attacks": [row("b", True), row("c", False), skipped], "scenario_seconds": {"rotation": 2.0}}
    merged = attack_matrix.merged(earlier, run, ["--only", "rotation", "--merge"])
    assert [r["attack"] for r in merged["attacks"]] == ["a", "b", "c", "d"]
    assert "measured" not in merged["attacks"][0] and merged["attacks"][1]["handled"] is True
    assert all(r["measured"]["command"].endswith("--only rotation --merge") for r in merged["attacks"][1:])
    assert merged["failed"] == ["c"] and merged["scenario_seconds"] == {"plain": 5.0, "rotation": 2.0}
    assert merged["earlier_provenance"] == earlier["provenance"]
    # A second partial run keeps naming the full run as where the unstamped rows come from.
    again = attack_matrix.merged({**merged, "provenance": {"command": "partial"}}, run, None)
    assert again["earlier_provenance"] == earlier["provenance"]
    # A scenario whose row text changed since: its old row goes with the scenario, the other scenarios' stay.
    stale = {**row("a rotation row as it read before", True), "scenario": "rotation"}
    kept = {**row("a plain row", True), "scenario": "plain"}
    rewritten = attack_matrix.merged({**earlier, "attacks": [stale, kept]}, run, None)
    assert [r["attack"] for r in rewritten["attacks"]] == ["a plain row", "b", "c", "d"]


def test_each_scenario_charges_ledgers_of_its_own_never_the_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import attack_matrix  # the script's module, on the benchmarks path above

    from fedfair.privacy.ledger_home import LEDGER_DIR_VARIABLE, ledger_folder

    users = tmp_path / "users-ledgers"
    monkeypatch.setenv(LEDGER_DIR_VARIABLE, str(users))
    seen: dict[str, Path] = {}

    def scenario(name: str) -> Any:
        def run(where: Path, book: object) -> None:
            seen[name] = ledger_folder()

        return run

    # The scenarios' functions are looked up when they run: these stand in for two real ones.
    monkeypatch.setattr(attack_matrix, "outcome_rows", scenario("outcome"))
    monkeypatch.setattr(attack_matrix, "rotation_rows", scenario("rotation"))
    keep = tmp_path / "kept"
    fedfair_logger = logging.getLogger("fedfair")
    level = fedfair_logger.level  # main quiets fedfair's log: the suite's later tests read it
    try:
        assert attack_matrix.main(["--only", "outcome", "--only", "rotation", "--keep", str(keep)]) == 0
    finally:
        fedfair_logger.setLevel(level)
    assert seen == {"outcome": keep / "ledgers" / "outcome", "rotation": keep / "ledgers" / "rotation"}
    assert ledger_folder() == users and not users.exists()


def test_the_hostile_client_speaks_this_releases_wire_version() -> None:
    """It keeps its own copy (an outsider imports no fedfair constant); a raised version must reach it too.

    So does its copy of the masked round's order, which its bindings count steps by: each name it binds is the
    stage the runtime's contract names there, in training and in evaluation.
    """
    from attacks.hostile_client import MASKED_ROUND, WIRE_VERSION as HOSTILE_VERSION, named_stage, stage_name

    from fedfair.runtime.contract import EVALUATION, TRAINING
    from fedfair.runtime.transport import WIRE_VERSION

    assert HOSTILE_VERSION == WIRE_VERSION, "raise WIRE_VERSION in benchmarks/attacks/hostile_client.py as well"
    assert MASKED_ROUND == tuple(spec.wire for spec in TRAINING.protocol.stages(True))
    for stages in (TRAINING, EVALUATION):
        for stage in (stages.start, *stages.uploads):
            assert named_stage(stages.name(stage)) == stage and stage_name(stage) == stages.name(stage)


@pytest.mark.slow
def test_the_full_matrixs_odd_value_rows_are_each_handled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The waits group's odd values (a 400-digit served timeout, steps = 10**30 and a 100,000-deep JSON in a
    privacy state file, latest = 1e999 in a record, a flipped checkpoint bit) run only in the full matrix, which the
    suite does not run: all four of the first ended once in a TypeError of the harness itself, unnoticed. About a
    minute of process starts, on ledgers of the test's own."""
    from attacks.rows import RowBook
    from attacks.waits import odd_value_rows

    from fedfair.privacy.ledger_home import LEDGER_DIR_VARIABLE

    monkeypatch.setenv(LEDGER_DIR_VARIABLE, str(tmp_path / "ledgers"))
    book = RowBook()
    odd_value_rows(tmp_path / "odd", book)
    failed = {row.attack: row.observed for row in book.rows if not row.handled}
    assert len(book.rows) == 5 and not failed, json.dumps(failed, indent=1)
