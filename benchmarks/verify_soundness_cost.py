"""What a check sound against colluding survivors would cost a party, against its secure round's CPU.

The shipped check (docs/security.md, "Verified aggregation") trusts each survivor's tags: a survivor that
colludes with the aggregator can tag an input other than the one it masked, so a wrong sum verifies
(issue 79). Closing that gap binds every survivor to the input it masked before the sum is known. This
script measures, per party and in CPU seconds (``time.process_time``: the machine is shared), the work
each candidate construction adds, for n in {3, 10} parties and d in {10^5, 10^6, 10^7} coordinates
(16-bit words, the runtime's default), each cell beside a secure round of the real runtime measured in the
same run (``benchmarks/round_bench.py``, threads, gRPC over loopback mutual TLS, training excluded, its
current verification included):

- ``pedersen``: a Pedersen vector commitment C_i = <x_i, G> + rho_i H over BLS12-381 G1 signed before
  UNMASK, and the check sum C_i == <S', G> + R H. A party's work is two multi-scalar multiplications of
  d points with 16-bit scalars (its commitment, and <S', G>), with the words turned into scalars
  (``py-arkworks-bls12381``, native Pippenger MSM). Measured at d = 10^5 (``pedersen_measured_points``
  points); the larger d are extrapolated linearly from that measured per-point cost (Pippenger's
  per-point cost falls slowly as d grows, so this overstates them a little). The generators (hash to
  curve, 0.44 ms a point here, cacheable once per d) are not counted.
- ``resum``: every site re-sums the survivors' masked inputs, fixed by their SHA-256 in the view it signed
  before UNMASK, and strips the masks with the rebuilt seeds (checked against the seed commitments of the
  signed advertisements): n masked inputs downloaded, each decrypted (AES-256-GCM over its bytes, a lower
  bound on TLS's share; gRPC's framing is not counted), parsed, hashed and added, and n self-mask streams
  subtracted. Measured at every d.
- ``recheck``: each party re-derives the value of ``max_colluding + 1`` = 2 peers' masked inputs under
  the challenge (download, decrypt, parse and hash each, its challenge dot product, its self-mask stream
  and that stream's dot product), so every survivor's value is recomputed by at least one honest party; plus
  the claim's carry vector (d bytes, one more dot product). Measured at every d by the same components; it
  does not grow with n. Built since (``fedfair/secagg/recheck.py``); ``benchmarks/recheck_cost.py`` measures the
  built one.

``*_vs_round`` is a candidate's CPU over the runtime round's per-party CPU (the issue's goal: 10% at
d = 10^6, n = 10). ``--dimensions`` picks the d measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from py_arkworks_bls12381 import G1Point, Scalar

from published import publish
from cpu_clock import fastest
from round_bench import run_configuration
from fedfair.secagg import prg
from fedfair.secagg.messages import MaskedInput
from fedfair.secagg.verify import Challenge, aggregate_digest
from fedfair.secagg.wire import Header, Stage

PARTIES = (3, 10)
DIMENSIONS = (10**5, 10**6, 10**7)
GOAL = 0.10
RUNTIME_ROUNDS = 2
PEDERSEN_POINTS = 10**5
MAX_COLLUDING = 1
WORD = np.uint16
TLS_RECORD = 1 << 14
"""TLS decrypts a stream in records of at most 2^14 bytes: the proxy decrypts as many."""


def pedersen_per_point() -> float:
    """CPU seconds per coordinate of one commitment-sized MSM: words to scalars (offset to unsigned), then MSM."""
    generator = G1Point()
    points, point = [], generator
    for _ in range(PEDERSEN_POINTS):
        points.append(point)
        point = point + generator
    words = np.random.default_rng(0).integers(0, 1 << 16, PEDERSEN_POINTS)

    def commit() -> None:
        G1Point.multiexp_unchecked(points, [Scalar(int(word)) for word in words.tolist()])

    return fastest(commit, repeats=2) / PEDERSEN_POINTS


class Wire:
    """One party's masked input as it arrives: encrypted records of its message's bytes."""

    def __init__(self, dimension: int) -> None:
        vector = np.random.default_rng(1).integers(0, 1 << 16, dimension + 1).astype(WORD)
        self.vector = vector
        self.bytes = MaskedInput(Header("bench", 1, Stage.MASK, b"s" * 32), 0, vector).to_bytes()
        self._cipher = AESGCM(os.urandom(32))
        self._nonce = os.urandom(12)
        self._records = [
            self._cipher.encrypt(self._nonce, self.bytes[at : at + TLS_RECORD], None)
            for at in range(0, len(self.bytes), TLS_RECORD)
        ]

    def receive(self) -> np.ndarray:
        """Decrypt, join, parse and hash the message, as a checking party must: its vector."""
        plain = b"".join(self._cipher.decrypt(self._nonce, record, None) for record in self._records)
        message = MaskedInput.from_bytes(plain)
        hashlib.sha256(message.vector.data).digest()
        return message.vector


def resum_seconds(wire: Wire, parties: int) -> float:
    """CPU of re-summing ``parties`` masked inputs and stripping as many self-mask streams."""

    def resum() -> None:
        total = wire.receive().copy()
        for _ in range(parties - 1):
            total += wire.receive()
        prg.apply_masks(total, [(bytes([party]) * 32, -1) for party in range(parties)])
        np.array_equal(total, wire.vector)

    return fastest(resum)


def recheck_seconds(wire: Wire) -> float:
    """CPU of recomputing ``MAX_COLLUDING + 1`` peers' challenge values, and the carries' dot product."""
    size = wire.vector.size
    challenge = Challenge(b"s" * 32, b"d" * 32, size)
    carries = np.ones(size, dtype=WORD)  # small integers; the dot kernel reads 16-bit words at the least

    def recheck() -> None:
        for peer in range(MAX_COLLUDING + 1):
            challenge.dots(wire.receive())
            challenge.dots(prg.words(bytes([peer]) * 32, size, WORD))
        challenge.dots(carries)

    return fastest(recheck)


def current_check_seconds(wire: Wire) -> float:
    """CPU of the shipped check's own per-party core: the claim's digest, the challenge and two dot products."""

    def check() -> None:
        digest = aggregate_digest(b"s" * 32, (1, 2, 3), (b"i" * 32,) * 3, wire.vector)
        challenge = Challenge(b"s" * 32, digest, wire.vector.size)
        challenge.dots(wire.vector)
        challenge.dots(wire.vector)

    return fastest(check)


def run_cell(parties: int, dimension: int, per_point: float) -> dict[str, Any]:
    """One (n, d) cell: each candidate's CPU per party, and the runtime round's, measured one after another."""
    wire = Wire(dimension)
    resum = resum_seconds(wire, parties)
    recheck = recheck_seconds(wire)
    current = current_check_seconds(wire)
    del wire
    pedersen = 2 * per_point * (dimension + 1)
    runtime = float(run_configuration(dimension, parties, secure=True, rounds=RUNTIME_ROUNDS)["party_cpu_seconds"])
    return {
        "n": parties,
        "d": dimension,
        "runtime_party_cpu_s": runtime,
        "current_check_cpu_s": current,
        "pedersen_cpu_s": pedersen,
        "pedersen_extrapolated": dimension != PEDERSEN_POINTS,
        "resum_cpu_s": resum,
        "recheck_cpu_s": recheck,
        "pedersen_vs_round": pedersen / runtime,
        "resum_vs_round": resum / runtime,
        "recheck_vs_round": recheck / runtime,
        "resum_download_bytes": parties * (dimension + 1) * 2,
        "recheck_download_bytes": (MAX_COLLUDING + 1) * (dimension + 1) * 2 + dimension + 1,
    }


def main(argv: list[str] | None = None) -> None:
    """Run the grid, interleaved, and print (and with --json, write) the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dimensions", type=int, nargs="+", default=list(DIMENSIONS), help="model sizes d")
    parser.add_argument("--json", type=Path, help="also write the JSON document here")
    arguments = parser.parse_args(argv)
    per_point = pedersen_per_point()
    # Warm up once (numba's kernels compile, gRPC starts) so that the first cell does not pay for it.
    run_configuration(1000, PARTIES[0], secure=True, rounds=1)
    current_check_seconds(Wire(1000))
    results = []
    for dimension in arguments.dimensions:
        for parties in PARTIES:
            cell = run_cell(parties, dimension, per_point)
            results.append(cell)
            print(json.dumps(cell), file=sys.stderr)
    document = {
        "benchmark": "verify_soundness_cost",
        "what": "a party's CPU for a sum check sound against the aggregator with colluding survivors, per "
        "candidate construction, over its CPU in a secure round of the runtime (threads, training excluded)",
        "clock": "time.process_time (CPU seconds of this process, all its threads)",
        "goal_ratio": GOAL,
        "max_colluding": MAX_COLLUDING,
        "pedersen_cpu_s_per_point": per_point,
        "pedersen_measured_points": PEDERSEN_POINTS,
        "results": results,
    }
    publish(document, arguments.json, argv)


if __name__ == "__main__":
    main()
