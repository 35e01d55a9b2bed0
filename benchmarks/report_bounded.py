"""The benchmark page's section on bounded inputs: the two-verifier proof's cost beside a secure round.

A row states only what ``benchmarks/results/input_bound_cost.json`` holds: first the whole bounded
round per site and per verifier, with the issue's goals at d = 10^5 marked met or not and the figure at
d = 10^6 stated, then one report's costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from report_tables import Section, count, fixed, milliseconds, ratio, table

GOAL_DIMENSION = 10**5
STATED_DIMENSION = 10**6


def _seconds(value: float) -> str:
    return fixed(value, 4)


def _with_ratio(shown: str, value: float) -> str:
    return f"{shown} ({ratio(value)})"


def _met(holds: bool) -> str:
    return "met" if holds else "**not met**"


def round_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Per (n, d): a site's CPU and bytes in the whole bounded round, each verifier's, and the secure round's."""
    return [
        (
            count(row["n"]),
            count(row["d"]),
            _seconds(row["runtime_party_cpu_s"]),
            count(round(row["runtime_party_bytes"])),
            _seconds(row["site_upload_cpu_s"]),
            _seconds(row["site_check_cpu_s"]),
            _with_ratio(_seconds(row["site_cpu_s"]), row["site_cpu_vs_round"]),
            _with_ratio(count(row["site_upload_bytes"]), row["site_upload_vs_masked"]),
            count(row["site_record_bytes"]),
            count(row["masked_site_up_bytes"]),
            count(row["masked_site_down_bytes"]),
            ratio(row["site_bytes_vs_masked"]),
            _with_ratio(_seconds(row["aggregator_round_cpu_s"]), row["aggregator_cpu_vs_round"]),
            _with_ratio(_seconds(row["auditor_round_cpu_s"]), row["auditor_cpu_vs_round"]),
            _with_ratio(count(row["verifier_exchange_bytes"]), row["verifier_exchange_vs_round"]),
            fixed(row["default_on"]),
        )
        for row in document["results"]
    ]


def goal_lines(document: Mapping[str, Any]) -> list[str]:
    """The goals at d = 10^5 per n, met or not, and the figures at d = 10^6."""
    lines = []
    for row in document["results"]:
        site = f"a site {_seconds(row['site_cpu_s'])} s CPU ({ratio(row['site_cpu_vs_round'])} the round's)"
        bytes_shown = (
            f"{count(row['site_upload_bytes'])} bytes up, {ratio(row['site_upload_vs_masked'])} the masked round's "
            f"{count(row['masked_site_up_bytes'])}; {count(row['site_record_bytes'])} down (the record; its tags "
            f"{count(row['site_tag_bytes'])} more), up and down {ratio(row['site_bytes_vs_masked'])} the masked "
            f"round's {count(row['masked_site_up_bytes'] + row['masked_site_down_bytes'])}"
        )
        verifiers = (
            f"the aggregator {_seconds(row['aggregator_round_cpu_s'])} s and the auditor "
            f"{_seconds(row['auditor_round_cpu_s'])} s a round"
        )
        if row["d"] == GOAL_DIMENSION:
            cpu_met = row["site_cpu_s"] <= document["goal_seconds"]
            bytes_met = row["site_upload_vs_masked"] <= document["goal_bytes_ratio"]
            lines.append(
                f"- d = 10^5, n = {row['n']}: CPU goal (at most {document['goal_seconds']:g} s) {_met(cpu_met)}: "
                f"{site}. Bytes goal (a site's upload at most {document['goal_bytes_ratio']:g}× the masked "
                f"round's) {_met(bytes_met)}: {bytes_shown}. Beside them, {verifiers}."
            )
        elif row["d"] == STATED_DIMENSION:
            lines.append(f"- d = 10^6, n = {row['n']}: {site}; {bytes_shown}; {verifiers}.")
    return lines


def _goal_rows(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [row for row in document["results"] if row["d"] == GOAL_DIMENSION]


def stage_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Per stage in which a site sends or is sent anything: its most bytes up and down in it, at d = 10^5 for each n."""
    rows = _goal_rows(document)
    stages = [
        stage
        for stage in (rows[0]["site_stage_bytes"] if rows else ())
        if any(sum(row["site_stage_bytes"][stage]) for row in rows)
    ]
    return [
        (
            stage,
            *(
                f"{count(row['site_stage_bytes'][stage][0])} / {count(row['site_stage_bytes'][stage][1])}"
                for row in rows
            ),
        )
        for stage in stages
    ]


def part_rows(document: Mapping[str, Any], key: str, whole: str) -> list[tuple[str, ...]]:
    """A message's bytes by part (``key``: the row's parts), with each part's share of the ``whole``, at d = 10^5."""
    rows = _goal_rows(document)
    parts = list(rows[0][key]) if rows else []
    return [
        (
            part.replace("_", " "),
            *(f"{count(row[key][part])} ({100 * row[key][part] / row[whole]:.1f}%)" for row in rows),
        )
        for part in parts
    ]


def report_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Per (n, d): one report's proof, upload and messages, and n reports' checking per verifier."""
    return [
        (
            count(row["n"]),
            count(row["d"]),
            _with_ratio(milliseconds(row["client_prove_cpu_s"]), row["client_vs_round_cpu"]),
            milliseconds(row["aggregator_reports_cpu_s"]),
            milliseconds(row["auditor_reports_cpu_s"]),
            _with_ratio(
                count(row["upload_to_aggregator_bytes"] + row["upload_to_auditor_bytes"]), row["upload_vs_round_bytes"]
            ),
            count(row["verifier_message_bytes"]),
            str(row["tests"]),
            f"{row['pedersen_commit_cpu_s']:.3g}",
        )
        for row in document["results"]
    ]


def input_bound_cost(name: str, document: Mapping[str, Any]) -> Section:
    """The bounded round per site and per verifier against the secure round, its goals, then one report's costs."""
    round_table = table(
        [
            "n",
            "d",
            "secure round CPU (s)",
            "secure round upload (bytes)",
            "site uploads (s)",
            "site record check (s)",
            "site CPU (s, × round)",
            "site up (bytes, × masked round)",
            "site down: record (bytes)",
            "masked round, site up (bytes)",
            "masked round, site down (bytes)",
            "site up + down (× masked round)",
            "aggregator round (s, × round)",
            "auditor round (s, × round)",
            "between verifiers (bytes, × round)",
            "default on",
        ],
        round_rows(document),
    )
    report_table = table(
        [
            "n",
            "d",
            "prove (ms, × round)",
            "aggregator, n reports (ms)",
            "auditor, n reports (ms)",
            "report upload (bytes, × round)",
            "verifier message (bytes)",
            "range tests",
            "Pedersen commit (CPU s)",
        ],
        report_rows(document),
    )
    ns = [f"n = {row['n']}" for row in _goal_rows(document)]
    stage_table = table(["stage", *(f"{n}: site up / down (bytes)" for n in ns)], stage_rows(document))
    upload_table = table(["upload part", *ns], part_rows(document, "site_upload_parts", "site_upload_bytes"))
    record_table = table(["record part", *ns], part_rows(document, "site_record_parts", "site_record_bytes"))
    return Section(
        "Bounded inputs: a party's proof to two verifiers against a secure runtime round",
        f"{document['what']}; clock: {document['clock']}; field {document['field']}, bound B = "
        f"{count(document['bound_encoded'])} in the encoded scale, each verifier adding its own Skellam(mu = "
        f"{document['noise_mu']:.3g}) to its total. The bounded round: {document['bounded_round']}. A site's CPU is its uploads "
        "(proof, sealing, signing) and its check of the verdict record (every decided party's evidence); its "
        "bytes are both parts up, the record down, and its tags up and the tag set down; the secure round's upload "
        "is what its aggregator received per party. The masked round's up and down is a site's every message in "
        "the runtime's verified masked round (16-bit words, re-summed where the round re-sums), simulated in one "
        "process: the goal's like-for-like measure, since the runtime's figure counts uploads only. Each "
        "verifier's CPU is its whole round; between the verifiers is their messages both ways, the auditor's total "
        f"and tags, and the record it is sent. Default: {document['default_rule']}. Pedersen: one "
        f"commitment to d coordinates at {1e6 * document['pedersen_cpu_s_per_point']:.2f} µs a point, a lower "
        "bound for the one-aggregator alternative.",
        [
            *round_table,
            "",
            "Against the goals:",
            "",
            *goal_lines(document),
            "",
            "Where a site's bytes go at d = 10^5: per stage, the most a site sent and was sent (the simulated "
            "round's messages through their bytes, framing included).",
            "",
            *stage_table,
            "",
            "Its SHARE upload by part (both parts, to the aggregator and sealed to the auditor; elements at 52 bits), "
            "and the verdict record it downloads by part; each part's share of the whole in brackets.",
            "",
            *upload_table,
            "",
            *record_table,
            "",
            "One report, for the breakdown: the client's proof alone, and each verifier's checking of n reports "
            "(n times one message and one decision) without the rest of its round.",
            "",
            *report_table,
        ],
    )
