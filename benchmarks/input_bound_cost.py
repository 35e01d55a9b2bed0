"""What proving each party's input within its L2 bound costs, per party and per verifier, beside a secure round.

The two-verifier construction (``fedfair.secagg.bounded``, docs/security.md "Bounded inputs (two
verifiers)"): a client encodes nothing new (its update is already integers), shares its input and a
witness over F_(2^61 - 1) and proves ||x||^2 <= B^2; the aggregator and the auditor each compute a
verifier message from their shares, exchange them and decide. For n in {3, 10} and d in {10^4, 10^5,
10^6}, each cell measures, in CPU seconds (``time.process_time``, the least of three runs: the machine
is shared) and bytes:

- ``client_prove_cpu_s``: a client's report (the auditor's expansion, the shares, the hashes, the range
  tests and the proof); it does not grow with n;
- ``aggregator_query_cpu_s`` and ``auditor_query_cpu_s``: one verifier message, and ``decide_cpu_s`` the
  decision; a verifier's work per round is n times both (``*_round_cpu_s``);
- ``upload_to_aggregator_bytes`` and ``upload_to_auditor_bytes`` (a party's shares), ``verifier_message_bytes``
  (each verifier to the other, per party) and ``auditor_total_bytes`` (the auditor's sum, once a round);
- beside them, a secure round of the real runtime measured in the same run (``benchmarks/round_bench.py``:
  threads, gRPC over loopback mutual TLS, 16-bit words, training excluded): its per-party CPU and the
  bytes the aggregator received per party. ``*_vs_round`` divide by those.

The bound is B = 2^15 in the encoded scale (a coordinate of a 16-bit word), where 64 range tests suffice;
a larger B needs more (``tests``). The one-aggregator alternative is priced from the Pedersen MSM measured
by ``benchmarks/verify_soundness_cost.py`` (its ``pedersen_cpu_s_per_point``): ``pedersen_commit_cpu_s`` is
one commitment to d coordinates, a lower bound (a norm proof on it costs several times more).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from published import publish
from cpu_clock import fastest
from round_bench import run_configuration
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.flp import VerifierShare
from fedfair.secagg.bounded.layout import Layout
from fedfair.secagg.bounded.shares import make_report
from fedfair.secagg.bounded.verifier import Role, Verifier, VerifierMessage, decide

PARTIES = (3, 10)
DIMENSIONS = (10**4, 10**5, 10**6)
BOUND = 1 << 15
RUNTIME_ROUNDS = 2
GOAL_SECONDS = 1.0
GOAL_BYTES_RATIO = 2.0
DEFAULT_WITHIN = 0.20
"""The mode is on by default where its client CPU is within 20% of the round's per-party CPU."""
PEDERSEN_RESULTS = Path(__file__).parent / "results" / "verify_soundness_cost.json"


def bounded_costs(dimension: int) -> dict[str, Any]:
    """One report's costs and sizes at ``dimension`` (they do not depend on n)."""
    layout = Layout(dimension, BOUND * BOUND)
    direction = np.random.default_rng(dimension).normal(size=dimension)
    x = np.trunc(direction * (BOUND / np.linalg.norm(direction))).astype(np.int64)  # at its bound, all but rounding
    inputs = field.from_signed(x)
    leader_share, helper_share = make_report(layout, inputs)
    prove = fastest(lambda: make_report(layout, inputs))
    seed = b"q" * 32
    messages: dict[Role, VerifierMessage] = {}

    def query(role: Role) -> None:
        verifier = Verifier(layout, role, seed)
        messages[role] = verifier.receive(0, leader_share if role is Role.LEADER else helper_share)

    leader_cpu, helper_cpu = fastest(lambda: query(Role.LEADER)), fastest(lambda: query(Role.HELPER))
    verdict = decide(layout, messages[Role.LEADER], messages[Role.HELPER])
    if not verdict.accepted:
        raise RuntimeError(f"an honest report was rejected at d={dimension}: {verdict.reasons}")
    decide_cpu = fastest(lambda: decide(layout, messages[Role.LEADER], messages[Role.HELPER]))
    share: VerifierShare = messages[Role.LEADER].share
    return {
        "tests": layout.tests,
        "proof_elements": layout.proof_length,
        "witness_bits": layout.witness_bits,
        "soundness_error": layout.soundness_error,
        "verifier_share_elements": share.outputs.size + share.wire_values.size + share.polynomial_values.size,
        "client_prove_cpu_s": prove,
        "aggregator_query_cpu_s": leader_cpu,
        "auditor_query_cpu_s": helper_cpu,
        "decide_cpu_s": decide_cpu,
        "upload_to_aggregator_bytes": leader_share.wire_bytes(),
        "upload_to_auditor_bytes": helper_share.wire_bytes(),
        "verifier_message_bytes": len(messages[Role.LEADER].to_bytes()),
        "auditor_total_bytes": dimension * field.ELEMENT_BYTES,
    }


def run_cell(parties: int, dimension: int, costs: dict[str, Any], per_point: float) -> dict[str, Any]:
    """One (n, d) cell: the report's costs beside the runtime round measured now."""
    runtime = run_configuration(dimension, parties, secure=True, rounds=RUNTIME_ROUNDS)
    round_cpu = float(runtime["party_cpu_seconds"])
    round_bytes = runtime["aggregator_received_bytes"] / parties
    upload = costs["upload_to_aggregator_bytes"] + costs["upload_to_auditor_bytes"]
    return {
        "n": parties,
        "d": dimension,
        **costs,
        "aggregator_round_cpu_s": parties * (costs["aggregator_query_cpu_s"] + costs["decide_cpu_s"]),
        "auditor_round_cpu_s": parties * (costs["auditor_query_cpu_s"] + costs["decide_cpu_s"]),
        "runtime_party_cpu_s": round_cpu,
        "runtime_party_bytes": round_bytes,
        "client_vs_round_cpu": costs["client_prove_cpu_s"] / round_cpu,
        "upload_vs_round_bytes": upload / round_bytes,
        "default_on": costs["client_prove_cpu_s"] <= DEFAULT_WITHIN * round_cpu,
        "pedersen_commit_cpu_s": per_point * dimension,
    }


def main(argv: list[str] | None = None) -> None:
    """Run the grid and print (and with --json, write) the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dimensions", type=int, nargs="+", default=list(DIMENSIONS), help="model sizes d")
    parser.add_argument("--json", type=Path, help="also write the JSON document here")
    arguments = parser.parse_args(argv)
    per_point = json.loads(PEDERSEN_RESULTS.read_text(encoding="utf-8"))["pedersen_cpu_s_per_point"]
    # Warm up once (numba's kernels compile, gRPC starts) so that the first cell does not pay for it.
    run_configuration(1000, PARTIES[0], secure=True, rounds=1)
    bounded_costs(1000)
    results = []
    for dimension in arguments.dimensions:
        costs = bounded_costs(dimension)
        for parties in PARTIES:
            cell = run_cell(parties, dimension, costs, per_point)
            results.append(cell)
            print(json.dumps(cell), file=sys.stderr)
    document = {
        "benchmark": "input_bound_cost",
        "what": "a party's CPU and bytes to prove its input within its L2 bound to two verifiers (aggregator and "
        "auditor), each verifier's CPU, beside the party's CPU and bytes in a secure round of the runtime",
        "clock": "time.process_time (CPU seconds of this process, all its threads)",
        "field": "F_p, p = 2^61 - 1",
        "bound_encoded": BOUND,
        "goal_seconds": GOAL_SECONDS,
        "goal_bytes_ratio": GOAL_BYTES_RATIO,
        "default_within": DEFAULT_WITHIN,
        "pedersen_cpu_s_per_point": per_point,
        "results": results,
    }
    publish(document, arguments.json, argv)


if __name__ == "__main__":
    main()
