"""What verified aggregation costs a party: its VERIFY stage's CPU over its secure round's.

For n in {3, 10} parties and d in {10^6, 10^7} coordinates (16-bit words, the runtime's default, and
32-bit), the script runs full in-process rounds with the VERIFY stage (real state machines, every
message serialised, :func:`fedfair.secagg.simulate.simulate_round` with ``verified=True``) and times
every step in CPU seconds (``time.process_time``: the machine is shared, so wall time would measure
the neighbours). Per party and round:

- round_cpu_s: its secure round: encoding its update plus its step in each of the six stages (less the
  copy a verifying party makes at MASK, which a round without verification does not);
- verify_cpu_s: what verification adds: its VERIFY steps (the digest of the claimed aggregate, the
  challenge, two exact dot products, the tag masks, one signature; then the survivors' signatures and
  the sum) plus the copy of its plain input kept at MASK (timed beside, on the same vector);
- verify_ratio: verify_cpu_s / round_cpu_s, median over parties and rounds (the issue's goal: 5%);
- runtime_party_cpu_s: the CPU one party spends on a whole secure round of the real runtime, measured in
  the same run right after the cell (16-bit words only, the runtime's default): a federation of
  ``benchmarks/round_bench.py`` in threads mode (aggregator, gRPC over loopback mutual TLS, every stage's
  messages, encoding, masking, and the runtime's own VERIFY stage), its ``party_cpu_seconds`` (the
  median over parties of each party's median over rounds of its round handlers' thread CPU); local
  training is excluded (each party sends a precomputed update);
- verify_vs_runtime_party_cpu: verify_cpu_s / runtime_party_cpu_s, the issue's measure (goal: 5%). The
  denominator includes the runtime's verification, so the ratio is the share of a verified round;
- digest_cpu_s, dots_cpu_s, copy_cpu_s: the parts of verify_cpu_s (the aggregate's SHA-256; the challenge
  and the two exact dot products; the kept copy), each timed on its own;
- server_verify_cpu_s: the server's VERIFY work (its digest, checking each tag's signature, relaying);
- extra_upload_bytes: the party's one extra message (its signed tags); extra_download_bytes: what it
  fetches in VERIFY (the claimed aggregate and the survivors' tags).

Everything is measured in one run, each cell beside its runtime federation, so the ratios are not
skewed by load that comes and goes. ``--dimensions`` picks the d measured (both by default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from published import publish
from cpu_clock import fastest
from round_bench import run_configuration
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig, largest_safe_fractional_bits
from fedfair.secagg.messages import Message
from fedfair.secagg.simulate import simulate_round
from fedfair.secagg.verify import Challenge, aggregate_digest
from fedfair.secagg.verify_messages import AggregateTag
from fedfair.secagg.wire import SUM_STAGES, Stage

PARTIES = (3, 10)
DIMENSIONS = (10**6, 10**7)
CLIP = 0.05
MAX_WEIGHT = 1.0
ROUNDS = 3
RUNTIME_ROUNDS = 2


def runtime_party_cpu(parties: int, dimension: int) -> float:
    """A party's CPU seconds in a secure round of the runtime (threads mode, training excluded), median."""
    return float(run_configuration(dimension, parties, secure=True, rounds=RUNTIME_ROUNDS)["party_cpu_seconds"])


def digest_seconds(dimension: int, modulus_bits: int) -> float:
    """CPU of one aggregate's digest (SHA-256 over its words), fastest of three: a part of verify_cpu_s."""
    vector = np.zeros(dimension + 1, dtype=f"<u{modulus_bits // 8}")
    return fastest(lambda: aggregate_digest(b"s" * 32, (1, 2, 3), (b"i" * 32,) * 3, vector))


def dots_seconds(dimension: int, modulus_bits: int) -> float:
    """CPU of drawing the challenge and two exact dot products (the aggregate's and the input's), fastest of three."""
    vector = np.ones(dimension + 1, dtype=f"<u{modulus_bits // 8}")

    def draw_and_dot() -> None:
        challenge = Challenge(b"s" * 32, b"d" * 32, vector.size)
        challenge.dots(vector)
        challenge.dots(vector)

    return fastest(draw_and_dot)


def run_cell(parties: int, dimension: int, modulus_bits: int, rounds: int) -> dict[str, Any]:
    """``rounds`` verified rounds of one configuration; its JSON record."""
    fractional_bits = largest_safe_fractional_bits(CLIP, modulus_bits, parties, MAX_WEIGHT)
    encoding = EncodingConfig(CLIP, MAX_WEIGHT, fractional_bits, modulus_bits)
    config = SecAggConfig("bench", 0, tuple(f"p{i}" for i in range(parties)), dimension, encoding)
    update = np.random.default_rng(0).uniform(-CLIP, CLIP, dimension)
    ratios: list[float] = []
    round_cpu: list[float] = []
    verify_cpu: list[float] = []
    server_cpu: list[float] = []
    uploads: list[int] = []
    copies: list[float] = []
    for _ in range(rounds):
        encode_cpu: dict[int, float] = {}
        copy_cpu: dict[int, float] = {}

        def encoded_input(party: int) -> np.ndarray:
            started = time.process_time()
            encoded = config.encoder.encode(update, 1.0)
            encode_cpu[party] = time.process_time() - started
            # What a verifying party adds at MASK: one copy of its plain encoding.
            started = time.process_time()
            kept = encoded.copy()
            copy_cpu[party] = time.process_time() - started
            del kept
            return encoded

        tags: dict[int, int] = {}

        def observe(message: Message) -> None:
            if isinstance(message, AggregateTag):
                tags[message.sender] = len(message.to_bytes())

        trace = simulate_round(config, encoded_input, observe=observe, verified=True, clock=time.process_time)
        assert sorted(trace.verified) == list(trace.result.contributors)
        for index, party in enumerate(sorted(trace.verified)):
            steps = sum(trace.client_seconds[stage][index] for stage in SUM_STAGES)
            mine = trace.client_seconds[Stage.VERIFY][index] + copy_cpu[party]
            # The party's own copy ran inside its MASK step: a round without verification does not make it.
            whole = encode_cpu[party] + steps - copy_cpu[party]
            round_cpu.append(whole)
            verify_cpu.append(mine)
            ratios.append(mine / whole)
        server_cpu.append(trace.server_seconds[Stage.VERIFY])
        copies.extend(copy_cpu.values())
        uploads.extend(tags.values())
    words = (dimension + 1) * modulus_bits // 8
    return {
        "n": parties,
        "d": dimension,
        "modulus_bits": modulus_bits,
        "rounds": rounds,
        "round_cpu_s": statistics.median(round_cpu),
        "verify_cpu_s": statistics.median(verify_cpu),
        "verify_ratio": statistics.median(ratios),
        "copy_cpu_s": statistics.median(copies),
        "digest_cpu_s": digest_seconds(dimension, modulus_bits),
        "dots_cpu_s": dots_seconds(dimension, modulus_bits),
        "server_verify_cpu_s": statistics.median(server_cpu),
        "extra_upload_bytes": statistics.median(uploads),
        "extra_download_bytes": words + parties * statistics.median(uploads),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the grid and print (and with --json, write) the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dimensions", type=int, nargs="+", default=list(DIMENSIONS), help="model sizes d")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--json", type=Path, help="also write the JSON document here")
    arguments = parser.parse_args(argv)
    results = []
    for dimension in arguments.dimensions:
        for parties in PARTIES:
            for bits in (16, 32):
                cell = run_cell(parties, dimension, bits, arguments.rounds)
                if bits == 16:
                    runtime = runtime_party_cpu(parties, dimension)
                    cell["runtime_party_cpu_s"] = runtime
                    cell["verify_vs_runtime_party_cpu"] = cell["verify_cpu_s"] / runtime
                results.append(cell)
                print(json.dumps(cell), file=sys.stderr)
    document = {
        "benchmark": "verify_bench",
        "what": "a party's CPU for verified aggregation (its VERIFY steps plus the kept copy: its tags, every "
        "survivor's tags and signatures checked) over its CPU in a secure round of the runtime (threads, training "
        "excluded, the runtime's own verification included) and over its secure-aggregation steps alone",
        "clock": "time.process_time (CPU seconds of this process; every step runs in it, one at a time)",
        "goal_ratio": 0.05,
        "results": results,
    }
    publish(document, arguments.json, argv)


if __name__ == "__main__":
    main()
