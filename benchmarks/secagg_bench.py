"""Secure-aggregation cost: masking time against the raw keystream, unmasking, expansion.

For every (n parties, d coordinates, dropout fraction) the script runs one full round
in-process (real state machines, every message serialised), with the dropped parties
leaving after sharing keys and before masking, the case that makes the server rebuild
their mask keys and cancel pairwise masks. It checks the decoded sum against the
plaintext and records:

Every time is CPU seconds of the one thread the round runs on (``time.thread_time``): the round and
its reference keystreams run on that thread alone, so load from other processes does not move them.

- client_mask_s: a party's MASK step (adding its self mask and pairwise masks in place, then the
  SHA-256 of its masked input that its signed view names), median over the sampled parties. Encoding is reported separately as client_encode_s;
  X25519 agreement happens in the SHARE step, as soon as the key directory is known, and
  the received shares are verified and decrypted in the CHECK step.
- mask_vs_keystream: for each sampled party, its MASK step time divided by the time
  the same PRG (AES-256-CTR) needs to produce the bytes that party must generate (its
  self mask and one stream per peer it masks with), timed once immediately before and
  once immediately after that party's step (their mean); the median of these paired
  ratios. Bracketing each step with single-shot measurements taken moments apart keeps
  load from other processes from skewing the ratio. SAMPLES parties are sampled; small
  federations run the round again until there are enough.
- digest_s: that SHA-256 of the masked input alone, timed on the party's message right after its
  step; masking_vs_keystream is mask_vs_keystream with it taken out (the masks' own cost), and
  client_total_less_digest_vs_keystream client_total_vs_keystream likewise.
- client_total_vs_keystream: for each sampled party, its encoding plus its MASK step,
  divided by the time the raw ``cryptography`` AES-256-CTR cipher needs to produce all the
  keystream bytes that party consumes (its mask streams plus the
  ``ROUNDING_BYTES_PER_COORDINATE`` bytes per coordinate of stochastic-rounding
  randomness, party_keystream_bytes), bracketed like
  mask_vs_keystream; the median of these paired ratios. Each party encodes into a buffer
  of its own that it reuses every round, as a collaborator process does, already mapped
  (as a collaborator's is after its first round: a fresh array's pages cost more to fault
  in than the encoding itself on the machine these figures come from). client_total_vs_mask_keystream
  is the same numerator over the mask streams' bytes alone (the stricter reading).
- critical_path: one party's own work and traffic: encode_s, mask_s, their sum
  (encode_plus_mask_s), steps_s (encoding plus the median of every stage's step),
  upload_bytes (all its messages) and masked_input_bytes (its MASK message).
- server_unmask_s: the server's UNMASK stage (checking responses, rebuilding secrets and
  verifying them against their commitments, removing masks, decoding, checking the range).
- stages: for each of the six stages (advertise, share, check, mask, consistency,
  unmask), clients_median_s (one party's step, median over parties and rounds),
  clients_total_s (all parties of one round together, median over rounds) and server_s
  (the server's receiving and closing steps, median over rounds).
- round_s: the wall time of one whole in-process round, median over the rounds run
  (every party's work and the server's on one machine, plus serialisation), minus the
  time spent in this script's callbacks (encoding and the keystream reference timings).
- expansion_vs_float32: median bytes a party uploads in the whole round divided by
  4 d (its update sent as float32 in the clear).

``--quick`` runs n in {3, 10} and d in {10^4, 10^6}; the full grid adds n in {50, 100}
and d = 10^7 where memory allows. Output is JSON on stdout and, with ``--json PATH``, in
that file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from published import publish
from fedfair.secagg import prg
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig, largest_safe_fractional_bits
from fedfair.secagg.rounder import ROUNDING_BYTES_PER_COORDINATE
from fedfair.secagg.messages import MaskedInput, Message
from fedfair.secagg.payloads import masked_input_digest
from fedfair.secagg.wire import SUM_STAGES, Stage
from fedfair.secagg.simulate import DropOut, simulate_round

FULL_PARTIES = (3, 10, 50, 100)
FULL_DIMENSIONS = (10**4, 10**6, 10**7)
QUICK_PARTIES = (3, 10)
QUICK_DIMENSIONS = (10**4, 10**6)
DROPOUTS = (0.0, 0.1, 0.3)
CLIP = 1.0
MAX_WEIGHT = 1000.0
SAMPLES = 10
CLOCK = time.thread_time
"""The clock of every figure: this thread's CPU seconds (the round and its references run on it alone)."""


RAW_CHUNK_BYTES = 1 << 19
"""The raw reference's bytes per cipher call: cache-sized, the fastest here (6.2-6.5 GB/s at 512 KiB-1 MiB
against 6.0 at 2 MiB). Masking itself draws larger blocks (``prg.BLOCK_BYTES``) to give the GIL up less
often; the reference does not follow it, so the ratio is against the fastest keystream there is."""


def keystream_seconds(streams: int, words: int, word_bytes: int, repeats: int) -> float:
    """Fastest of ``repeats`` times to generate ``streams`` keystreams of ``words`` words with the masking PRG.

    Same cipher, same block size and same reused buffer as ``prg.apply_masks``, minus the
    additions: the cost floor of masking.
    """
    block = bytearray(prg.BLOCK_BYTES)
    view = memoryview(block)
    total = words * word_bytes
    times = []
    for _ in range(repeats):
        keys = [os.urandom(prg.KEY_BYTES) for _ in range(streams)]
        start = CLOCK()
        for key in keys:
            stream = prg.Keystream(key)
            for offset in range(0, total, prg.BLOCK_BYTES):
                stream.read_into(view[: min(prg.BLOCK_BYTES, total - offset)])
        times.append(CLOCK() - start)
    return min(times)


def raw_keystream_seconds(size: int) -> float:
    """Time for the raw ``cryptography`` AES-256-CTR cipher to produce ``size`` keystream bytes.

    No fedfair code in the loop: the cipher encrypts zeros into one reused buffer of
    :data:`RAW_CHUNK_BYTES`, the fastest way to draw a keystream through its API.
    """
    zeros = bytes(RAW_CHUNK_BYTES)
    buffer = bytearray(RAW_CHUNK_BYTES)
    encryptor = Cipher(algorithms.AES(os.urandom(prg.KEY_BYTES)), modes.CTR(bytes(16))).encryptor()
    start = CLOCK()
    for _ in range(size // RAW_CHUNK_BYTES):
        encryptor.update_into(zeros, buffer)
    tail = size % RAW_CHUNK_BYTES
    if tail:
        encryptor.update_into(zeros[:tail], memoryview(buffer)[:tail])
    return CLOCK() - start


def keystream_gbps(size: int) -> float:
    """Raw keystream throughput in GB/s (10^9 bytes per second), best of five."""
    return size / keystream_seconds(1, size // 8, 8, repeats=5) / 1e9


def run_cell(parties: int, dimension: int, dropout: float, modulus_bits: int) -> dict[str, Any]:
    """One cell of the grid (one round, or more until SAMPLES parties were timed); its JSON record."""
    fractional_bits = largest_safe_fractional_bits(CLIP, modulus_bits, parties, MAX_WEIGHT)
    encoding = EncodingConfig(CLIP, MAX_WEIGHT, fractional_bits, modulus_bits)
    config = SecAggConfig("bench", 0, tuple(f"p{i}" for i in range(parties)), dimension, encoding)
    # Spread the dropped parties over the id range; never more than the threshold allows.
    dropped_count = min(round(dropout * parties), parties - config.t)
    dropped = sorted({1 + (i * parties) // max(dropped_count, 1) for i in range(dropped_count)})

    # Benchmark data only (no key or mask comes from numpy). Party i sends w_i * s_i * base,
    # so inputs are made on the fly and the plaintext sum is known without storing them.
    rng = np.random.default_rng(parties * 1_000_003 + dimension)
    base = rng.uniform(-CLIP, CLIP, size=dimension)
    scales = rng.uniform(-1.0, 1.0, size=parties)
    weights = rng.uniform(1.0, MAX_WEIGHT, size=parties)
    word_bytes = modulus_bits // 8
    streams = parties  # its self mask plus one per other party that shared keys (all of them here)
    mask_bytes = streams * (dimension + 1) * word_bytes
    # Every coordinate (and the weight) draws keystream bytes for its rounding.
    party_bytes = mask_bytes + (dimension + 1) * ROUNDING_BYTES_PER_COORDINATE
    encode_seconds: list[float] = []
    encode_samples: list[float] = []
    keystream_before: list[float] = []
    keystream_after: list[float] = []
    party_keystream_before: list[float] = []
    party_keystream_after: list[float] = []
    mask_samples: list[float] = []
    callback_seconds: list[float] = []
    masked_input_bytes: list[int] = []
    digest_samples: list[float] = []

    # Each party encodes into one buffer of its own every round, as a collaborator process does;
    # the buffers start as a collaborator's is after its first round, with their pages mapped.
    buffers = {party: np.full(dimension + 1, 0, dtype=config.encoder.dtype) for party in range(1, parties + 1)}

    def encoded_input(party: int) -> np.ndarray:
        entered = CLOCK()
        weighted = base * (weights[party - 1] * scales[party - 1])
        start = CLOCK()
        encoded = config.encoder.encode(weighted, float(weights[party - 1]), out=buffers[party])
        encode_seconds.append(CLOCK() - start)
        if len(keystream_before) < SAMPLES:
            # simulate_round calls this right before the party's MASK step ...
            encode_samples.append(encode_seconds[-1])
            keystream_before.append(keystream_seconds(streams, dimension + 1, word_bytes, repeats=1))
            party_keystream_before.append(raw_keystream_seconds(party_bytes))
        callback_seconds.append(CLOCK() - entered)
        return encoded

    def observe(message: Message) -> None:
        # ... and this right after it (once the message is on the wire).
        if isinstance(message, MaskedInput) and len(keystream_after) < len(keystream_before):
            entered = CLOCK()
            keystream_after.append(keystream_seconds(streams, dimension + 1, word_bytes, repeats=1))
            party_keystream_after.append(raw_keystream_seconds(party_bytes))
            start = CLOCK()
            masked_input_digest(bytes(32), message.sender, message.vector)
            digest_samples.append(CLOCK() - start)
            if not masked_input_bytes:
                masked_input_bytes.append(len(message.to_bytes()))
            callback_seconds.append(CLOCK() - entered)

    traces = []
    round_seconds: list[float] = []
    while len(mask_samples) < SAMPLES:
        sampled_before = len(keystream_before)
        start, callbacks_before = CLOCK(), sum(callback_seconds)
        trace = simulate_round(config, encoded_input, DropOut({Stage.MASK: dropped}), observe, clock=CLOCK)
        round_seconds.append(CLOCK() - start - (sum(callback_seconds) - callbacks_before))
        traces.append(trace)
        # At least t parties mask in every round, so each round adds samples.
        mask_samples += trace.client_seconds[Stage.MASK][: len(keystream_before) - sampled_before]
    keystream_samples = [(a + b) / 2 for a, b in zip(keystream_before, keystream_after, strict=True)]
    party_keystream_samples = [(a + b) / 2 for a, b in zip(party_keystream_before, party_keystream_after, strict=True)]
    client_totals = [encode + mask for encode, mask in zip(encode_samples, mask_samples, strict=True)]
    masking_samples = [mask - digest for mask, digest in zip(mask_samples, digest_samples, strict=True)]

    result = traces[0].result
    included = np.array(result.contributors) - 1
    expected = base * float(weights[included] @ scales[included])
    max_abs_error = float(np.max(np.abs(result.decoded.weighted_sum - expected)))
    # The plaintext reference has float64 rounding of its own; allow for it.
    if max_abs_error > result.decoded.error_bound + 1e-12 * float(np.max(np.abs(expected))):
        raise AssertionError(f"n={parties} d={dimension}: error {max_abs_error} exceeds the bound")
    upload = statistics.median(traces[0].upload_bytes[p] for p in result.contributors)
    stages = {
        stage.name.lower(): {
            "clients_median_s": statistics.median(
                seconds for trace in traces for seconds in trace.client_seconds[stage]
            ),
            "clients_total_s": statistics.median(sum(trace.client_seconds[stage]) for trace in traces),
            "server_s": statistics.median(trace.server_seconds[stage] for trace in traces),
        }
        for stage in SUM_STAGES
    }
    encode_s, mask_s = statistics.median(encode_seconds), statistics.median(mask_samples)
    return {
        "n": parties,
        "d": dimension,
        "dropout": dropout,
        "dropped": len(dropped),
        "threshold": config.t,
        "modulus_bits": modulus_bits,
        "fractional_bits": fractional_bits,
        "rounds": len(traces),
        "client_encode_s": encode_s,
        "client_mask_s": mask_s,
        "keystream_s": statistics.median(keystream_samples),
        "keystream_bytes": mask_bytes,
        "mask_vs_keystream": statistics.median(
            mask / keystream for mask, keystream in zip(mask_samples, keystream_samples, strict=True)
        ),
        "digest_s": statistics.median(digest_samples),
        "masking_vs_keystream": statistics.median(
            masking / keystream for masking, keystream in zip(masking_samples, keystream_samples, strict=True)
        ),
        "party_keystream_s": statistics.median(party_keystream_samples),
        "party_keystream_bytes": party_bytes,
        "client_total_vs_keystream": statistics.median(
            total / keystream for total, keystream in zip(client_totals, party_keystream_samples, strict=True)
        ),
        "client_total_less_digest_vs_keystream": statistics.median(
            (encode + masking) / keystream
            for encode, masking, keystream in zip(encode_samples, masking_samples, party_keystream_samples, strict=True)
        ),
        "client_total_vs_mask_keystream": statistics.median(
            total / keystream for total, keystream in zip(client_totals, keystream_samples, strict=True)
        ),
        "critical_path": {
            "encode_s": encode_s,
            "mask_s": mask_s,
            "encode_plus_mask_s": statistics.median(client_totals),
            "steps_s": encode_s + sum(spent["clients_median_s"] for spent in stages.values()),
            "upload_bytes": upload,
            "masked_input_bytes": masked_input_bytes[0],
        },
        "server_unmask_s": statistics.median(trace.server_seconds[Stage.UNMASK] for trace in traces),
        "round_s": statistics.median(round_seconds),
        "stages": stages,
        "expansion_vs_float32": upload / (4 * dimension),
        "max_abs_error": max_abs_error,
        "error_bound": result.decoded.error_bound,
    }


def fits_in_memory(dimension: int) -> bool:
    """Whether a round at ``dimension`` fits comfortably in memory.

    A round holds about a dozen float64 vectors at once (input, encoding temporaries,
    masked vector, running sum); they must fit in half the physical memory.
    """
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return 12 * 8 * dimension < physical // 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n in {3, 10}, d in {10^4, 10^6} (about a minute)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the JSON here")
    parser.add_argument("--modulus-bits", type=int, default=32, choices=(32, 64), help="word size k (default 32)")
    args = parser.parse_args(argv)

    parties_grid = QUICK_PARTIES if args.quick else FULL_PARTIES
    dimension_grid = QUICK_DIMENSIONS if args.quick else FULL_DIMENSIONS
    report: dict[str, Any] = {
        "keystream_gbps": keystream_gbps(64 * 2**20 if args.quick else 256 * 2**20),
        "prg": "AES-256-CTR (cryptography/OpenSSL)",
        "modulus_bits": args.modulus_bits,
        "results": [],
        "skipped": [],
    }
    for dimension in dimension_grid:
        if not fits_in_memory(dimension):
            report["skipped"].append({"d": dimension, "reason": "not enough memory"})
            continue
        for parties in parties_grid:
            for dropout in DROPOUTS:
                record = run_cell(parties, dimension, dropout, args.modulus_bits)
                report["results"].append(record)
                stages = " ".join(
                    f"{name}={spent['clients_median_s'] * 1e3:.1f}/{spent['server_s'] * 1e3:.1f}"
                    for name, spent in record["stages"].items()
                )
                print(
                    f"n={parties:<4} d={dimension:<9} dropout={dropout:.0%} encode={record['client_encode_s']:.4f}s "
                    f"mask={record['client_mask_s']:.4f}s x{record['mask_vs_keystream']:.2f} keystream "
                    f"encode+mask x{record['client_total_vs_keystream']:.2f} party keystream  "
                    f"unmask={record['server_unmask_s']:.4f}s "
                    f"expansion={record['expansion_vs_float32']:.3f} round={record['round_s']:.3f}s\n"
                    f"    per stage, ms (one party / server): {stages}",
                    file=sys.stderr,
                )
    publish(report, args.json, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
