"""What the built re-check costs a party above the re-sum bound, against its secure round's CPU (issue 97).

For each cell (n parties, d coordinates, 16-bit words, ``max_colluding = 1``: each party re-checks 2 peers), measured
one after another in CPU seconds (``time.process_time``: the machine is shared): a party's VERIFY stage in an
in-process round (``simulate_round(verified=True)``, the real Client and Server, every message serialised) with the
re-check, and the same round with ``max_colluding = 0`` (the tags alone), each the least of ``--repeats`` rounds;
the server's VERIFY work the same way (the carries); and the CPU a party spends on a whole secure round of the real
runtime (``benchmarks/round_bench.py``, threads, gRPC over loopback mutual TLS, training excluded). The re-check's
cost is the difference of the two VERIFY figures (download parsing excluded: the claim arrives as a view), and
``recheck_vs_round`` its share of the runtime round (the issue's goal: 10%). ``--cells N:D ...`` picks the cells.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from published import publish
from round_bench import run_configuration
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.security import SecurityParameters
from fedfair.secagg.encode import EncodingConfig, largest_safe_fractional_bits
from fedfair.secagg.simulate import simulate_round
from fedfair.secagg.wire import Stage

CELLS = ((10, 10**6), (3, 10**7))
GOAL = 0.10
RUNTIME_ROUNDS = 2
MAX_COLLUDING = 1


def config_of(parties: int, dimension: int, max_colluding: int) -> SecAggConfig:
    """A round of `parties` over `dimension` coordinates in 16-bit words, allowing `max_colluding` colluders."""
    bits = largest_safe_fractional_bits(1.0, 16, parties, 1.0)
    encoding = EncodingConfig(1.0, 1.0, fractional_bits=bits, modulus_bits=16)
    names = tuple(f"site-{index}" for index in range(1, parties + 1))
    return SecAggConfig("bench", 1, names, dimension, encoding, SecurityParameters(max_colluding, None, None))


def verify_seconds(parties: int, dimension: int, max_colluding: int, repeats: int) -> tuple[float, float]:
    """The least, over `repeats` in-process rounds, of a party's mean VERIFY CPU and of the server's."""
    config = config_of(parties, dimension, max_colluding)
    assert not config.resummed and config.rechecked == (max_colluding > 0)
    rng = np.random.default_rng(0)
    inputs = {
        party: config.encoder.encode(rng.uniform(-1, 1, dimension) / parties, 1.0, randomness_key=bytes([party]) * 32)
        for party in range(1, parties + 1)
    }
    party_best, server_best = float("inf"), float("inf")
    for _ in range(repeats):
        trace = simulate_round(config, lambda party: inputs[party].copy(), verified=True, clock=time.process_time)
        assert len(trace.verified) == parties, "every party must verify the honest sum"
        party_best = min(party_best, float(np.mean(list(trace.party_seconds[Stage.VERIFY].values()))))
        server_best = min(server_best, trace.server_seconds[Stage.VERIFY])
    return party_best, server_best


def run_cell(parties: int, dimension: int, repeats: int) -> dict[str, Any]:
    """One (n, d) cell: VERIFY with and without the re-check, and the runtime round, one after another."""
    rechecked, server_rechecked = verify_seconds(parties, dimension, MAX_COLLUDING, repeats)
    tags_alone, server_tags_alone = verify_seconds(parties, dimension, 0, repeats)
    runtime = float(run_configuration(dimension, parties, secure=True, rounds=RUNTIME_ROUNDS)["party_cpu_seconds"])
    recheck = rechecked - tags_alone
    return {
        "n": parties,
        "d": dimension,
        "max_colluding": MAX_COLLUDING,
        "runtime_party_cpu_s": runtime,
        "party_verify_rechecked_cpu_s": rechecked,
        "party_verify_tags_alone_cpu_s": tags_alone,
        "recheck_cpu_s": recheck,
        "recheck_vs_round": recheck / runtime,
        "server_verify_rechecked_cpu_s": server_rechecked,
        "server_verify_tags_alone_cpu_s": server_tags_alone,
        "recheck_download_bytes": (MAX_COLLUDING + 1) * (dimension + 1) * 2 + (dimension + 1) * 2,
    }


def main(argv: list[str] | None = None) -> None:
    """Run the cells, and print (and with --json, write) the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=[f"{n}:{d}" for n, d in CELLS], help="cells as N:D")
    parser.add_argument("--repeats", type=int, default=2, help="in-process rounds per VERIFY figure (the least)")
    parser.add_argument("--json", type=Path, help="also write the JSON document here")
    arguments = parser.parse_args(argv)
    verify_seconds(3, 1 << 21, MAX_COLLUDING, 1)  # numba's kernels compile once, outside every cell (above the bound)
    results = []
    for cell in arguments.cells:
        parties, dimension = (int(part) for part in cell.split(":"))
        result = run_cell(parties, dimension, arguments.repeats)
        results.append(result)
        print(json.dumps(result), file=sys.stderr)
    document = {
        "benchmark": "recheck_cost",
        "what": "a party's CPU for the built re-check (VERIFY with it less VERIFY with the tags alone), over its CPU "
        "in a secure round of the runtime (threads, training excluded)",
        "clock": "time.process_time (CPU seconds of this process, all its threads)",
        "goal_ratio": GOAL,
        "results": results,
    }
    publish(document, arguments.json, argv)


if __name__ == "__main__":
    main()
