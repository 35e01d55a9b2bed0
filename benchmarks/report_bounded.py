"""The benchmark page's section on bounded inputs: the two-verifier proof's cost beside a secure round.

A row states only what ``benchmarks/results/input_bound_cost.json`` holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from report_tables import Section, count, fixed, milliseconds, ratio, table


def input_bound_cost(name: str, document: Mapping[str, Any]) -> Section:
    """One row per (n, d): a party's proof CPU and upload, each verifier's CPU per round, against the round's."""
    rows = [
        (
            count(row["n"]),
            count(row["d"]),
            milliseconds(row["runtime_party_cpu_s"]),
            f"{milliseconds(row['client_prove_cpu_s'])} ({ratio(row['client_vs_round_cpu'])})",
            milliseconds(row["aggregator_round_cpu_s"]),
            milliseconds(row["auditor_round_cpu_s"]),
            count(round(row["runtime_party_bytes"])),
            f"{count(row['upload_to_aggregator_bytes'] + row['upload_to_auditor_bytes'])} "
            f"({ratio(row['upload_vs_round_bytes'])})",
            count(row["verifier_message_bytes"]),
            str(row["tests"]),
            f"{row['pedersen_commit_cpu_s']:.3g}",
            fixed(row["default_on"]),
        )
        for row in document["results"]
    ]
    return Section(
        "Bounded inputs: a party's proof to two verifiers against a secure runtime round",
        f"{document['what']}; clock: {document['clock']}; field {document['field']}, bound B = "
        f"{count(document['bound_encoded'])} in the encoded scale. Goals at d = 10^5: at most "
        f"{document['goal_seconds']:g} s and {document['goal_bytes_ratio']:g}× the round's bytes. Default on where "
        f"the proof is within {document['default_within']:.0%} of the round's CPU. The verifiers' CPU is per round "
        "(n reports); the upload is both shares (the aggregator's explicit, the auditor's a seed) and replaces the "
        "masked input; each verifier also sends the other one message per party. Pedersen: one commitment to d "
        f"coordinates at {1e6 * document['pedersen_cpu_s_per_point']:.2f} µs a point, a lower bound for the "
        "one-aggregator alternative.",
        table(
            [
                "n",
                "d",
                "runtime round (ms)",
                "prove (ms, × round)",
                "aggregator per round (ms)",
                "auditor per round (ms)",
                "round upload (bytes)",
                "bounded upload (bytes, × round)",
                "verifier message (bytes)",
                "range tests",
                "Pedersen commit (CPU s)",
                "default on",
            ],
            rows,
        ),
    )
