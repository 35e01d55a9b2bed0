"""benchmarks/input_bound_cost.py's round-level figures and their section on docs/benchmarks.md.

The simulated round's bytes follow from one report's sizes (the record carries both verifiers' messages for
every party, and the total once: d elements; the verifiers exchange the messages once each way, the auditor sends its
total and its tags once and is sent the record), and the page marks the goals at d = 10^5 met or not from the
figures alone.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedfair.secagg.bounded.layout import DEFAULT_POINTS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def benchmarks() -> Iterator[tuple[Any, Any]]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import input_bound_cost
        import report_bounded

        yield input_bound_cost, report_bounded
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_round_bytes_are_the_reports_messages_for_every_party(benchmarks: tuple[Any, Any]) -> None:
    cost, _ = benchmarks
    parties, dimension = 3, 300
    report, measured = cost.bounded_costs(dimension), cost.round_costs(parties, dimension)
    message = report["verifier_message_bytes"]
    # Per party: its id, length prefixes, the verifiers' two ECDSA signatures (at most 72 bytes each), and the
    # site's own signature over its two parts' digests (72 bytes and 2 x 32, with their prefixes: 144 in all).
    framing = 200 + 144
    evidence = 2 * parties * message
    total = report["auditor_total_bytes"]  # the total the aggregator applies, d elements, once
    record = measured["site_record_bytes"]
    assert evidence + total < record <= evidence + total + parties * framing + 300
    round_key = 32 + 72 + 8  # the auditor's signed X25519 round key (AUDITOR_KEY): key, signature, two prefixes
    tags = 8 + 4 + 16 + 8 + 72  # the auditor's tags of its total (DECIDE): its id, two elements, a signature
    exchanged = evidence + total + round_key + record  # the auditor is sent the record to tag its total under
    assert exchanged < measured["verifier_exchange_bytes"] <= exchanged + tags + parties * (framing + 2 * 40) + 400
    # Beside the shares: two signatures (at most 72 bytes each), two digests, the ephemeral key, the seal's
    # nonce and tag, the ids and length prefixes, the same at every d.
    upload = report["upload_to_aggregator_bytes"] + report["upload_to_auditor_bytes"]
    assert upload < measured["site_upload_bytes"] <= upload + 512
    # A site's signed tags up, and the tag set down with every site's and the auditor's: parties + 2 entries of an
    # id (8 bytes), two elements (16) and an ECDSA signature (68 to 72), each with its length prefixes.
    entries = parties + 2
    assert entries * (8 + 16 + 68) < measured["site_tag_bytes"] <= entries * (8 + 16 + 72 + 16) + 64
    assert measured["site_cpu_s"] == pytest.approx(measured["site_upload_cpu_s"] + measured["site_check_cpu_s"])
    assert all(measured[key] > 0 for key in ("site_check_cpu_s", "aggregator_round_cpu_s", "auditor_round_cpu_s"))


def test_a_sites_bytes_by_part_add_up_to_what_it_sent_and_was_sent(benchmarks: tuple[Any, Any]) -> None:
    cost, _ = benchmarks
    parties, dimension = 3, 300
    measured, report = cost.round_costs(parties, dimension), cost.bounded_costs(dimension)
    upload, record = measured["site_upload_parts"], measured["site_record_parts"]
    assert sum(upload.values()) == measured["site_upload_bytes"]
    assert sum(record.values()) == measured["site_record_bytes"]
    # x at 52 bits a coordinate; the proof's share is its 2N - 1 polynomial values and the 32-byte seed of its wire
    # seeds, not the 4c wire seeds themselves; the rest is the length prefixes of the messages' fields.
    assert upload["x_share"] == (52 * dimension + 7) // 8
    assert upload["proof_share"] == (52 * (2 * DEFAULT_POINTS - 1) + 7) // 8 + 32
    assert 0 < upload["framing"] <= 128 and 0 < record["framing"] <= 100 + 48 * parties  # 8-byte prefixes, ids
    assert record["total"] == (52 * dimension + 7) // 8
    assert record["verifier_messages"] == 2 * parties * report["verifier_message_bytes"]
    stages = measured["site_stage_bytes"]
    assert stages["SHARE"][0] == measured["site_upload_bytes"] and stages["DECIDE"][1] == measured["site_record_bytes"]


def test_the_masked_round_a_site_is_compared_with_sends_it_every_survivors_masked_input(
    benchmarks: tuple[Any, Any],
) -> None:
    # The bytes goal's denominator: a site's uploads and downloads in the verified masked round, which re-sums
    # at this size, so each site downloads every survivor's masked input (d + 1 words of 16 bits each) and the sum.
    cost, _ = benchmarks
    parties, dimension = 3, 300
    masked = cost.masked_site_bytes(parties, dimension)
    assert masked["masked_resummed"]
    words = 2 * (dimension + 1)
    assert words < masked["masked_site_up_bytes"] < 2 * words + 2048
    assert (parties + 1) * words < masked["masked_site_down_bytes"]


def row(parties: int, dimension: int, site_cpu: float, site_upload_ratio: float) -> dict[str, Any]:
    return {
        "n": parties, "d": dimension, "runtime_party_cpu_s": 0.1, "runtime_party_bytes": 2.0 * dimension,
        "site_upload_cpu_s": site_cpu - 0.01, "site_check_cpu_s": 0.01, "site_cpu_s": site_cpu,
        "site_cpu_vs_round": site_cpu / 0.1, "site_upload_bytes": 8 * dimension, "site_upload_vs_round": 4.0,
        "site_record_bytes": dimension, "site_tag_bytes": 500, "site_bytes_vs_masked": 1.5,
        "site_upload_vs_masked": site_upload_ratio,
        "masked_site_up_bytes": 2 * dimension, "masked_site_down_bytes": 8 * dimension, "aggregator_round_cpu_s": 0.3,
        "auditor_round_cpu_s": 0.4, "aggregator_cpu_vs_round": 3.0, "auditor_cpu_vs_round": 4.0,
        "verifier_exchange_bytes": dimension, "verifier_exchange_vs_round": 0.5, "default_on": site_cpu <= 0.02,
        "client_prove_cpu_s": 0.01, "client_vs_round_cpu": 0.1, "aggregator_reports_cpu_s": 0.2,
        "auditor_reports_cpu_s": 0.2, "upload_to_aggregator_bytes": 8 * dimension, "upload_to_auditor_bytes": 96,
        "upload_vs_round_bytes": 4.0, "verifier_message_bytes": 100, "tests": 64, "pedersen_commit_cpu_s": 0.5,
        "site_stage_bytes": {"SHARE": (8 * dimension, 100), "DECIDE": (110, dimension)},
        "site_upload_parts": {"x_share": 6 * dimension, "framing": 2 * dimension},
        "site_record_parts": {"total": dimension // 2, "framing": dimension // 2},
    }  # fmt: skip


def test_the_section_marks_the_goals_at_ten_to_the_five_and_states_ten_to_the_six(
    benchmarks: tuple[Any, Any],
) -> None:
    _, report = benchmarks
    document = {
        "what": "w", "clock": "c", "field": "F", "bound_encoded": 32768, "noise_mu": 5e8, "bounded_round": "b",
        "default_rule": "r", "default_within": 0.2, "goal_seconds": 1.0, "goal_bytes_ratio": 2.0,
        "pedersen_cpu_s_per_point": 5e-6,
        "results": [row(3, 10**4, 0.01, 5.0), row(3, 10**5, 0.9, 1.9), row(10, 10**5, 1.2, 2.1), row(10, 10**6, 3.0, 6.0)],
    }  # fmt: skip
    section = report.input_bound_cost("input_bound_cost", document)
    goals = [line for line in section.body if line.startswith("- d = ")]
    assert len(goals) == 3
    assert (
        "n = 3: CPU goal (at most 1 s) met" in goals[0]
        and "Bytes goal (a site's upload at most 2× the masked round's) met" in goals[0]
    )
    assert "CPU goal (at most 1 s) **not met**" in goals[1] and "masked round's) **not met**" in goals[1]
    assert goals[2].startswith("- d = 10^6, n = 10: a site 3.0000 s CPU (30.00× the round's)")
    # The two tables of every cell, then at d = 10^5 (two cells, one column each) the stages and the parts.
    assert sum(line.startswith("| ") for line in section.body) == 2 * (1 + len(document["results"])) + 3 * (1 + 2)
    body = "\n".join(section.body)
    assert "| SHARE | 800,000 / 100 | 800,000 / 100 |" in body
    assert "| x share | 600,000 (75.0%) | 600,000 (75.0%) |" in body
