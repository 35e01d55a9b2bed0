"""What a round of the runtime costs beyond local training: secure versus plain aggregation.

For d in {10^4, 10^6} model parameters and n in {3, 10, 20, 50, 100} collaborators, the script runs
a federation through the real runtime (the aggregator's gRPC server and round driver,
real `Collaborator` objects, gRPC over loopback mutual TLS) and records the wall time
of each training round as the aggregator logs it: from opening STAGE_TRAIN to the
decoded sum (download of (theta, c), every stage's uploads and relays, masking,
unmasking, decoding). Local training is taken out by giving every collaborator a
precomputed update (`FixedUpdate`), so the time is the runtime's own.

By default the collaborators run as threads of this one process, not as separate
processes (and not on separate machines): they share this machine's cores with each
other and with the aggregator, and their Python work is serialised by one interpreter
lock, so each party's masking, signing and message handling, which a deployment runs in
parallel on its own hardware, runs one party at a time here. The secure/plain ratio
measured this way is a pessimistic one. With `--processes` each collaborator is a
process of its own (still on these cores): what one host running every site would see. It refuses to start
where the machine's available memory (MemAvailable) is below its estimate of the need (every party process at
450 MiB and four float32 copies of the model, and the aggregator's; `round_bench_parties.processes_memory_need`)
unless `--force` is given.

Local training is nothing (the update is ready at once) unless `--train-seconds S` makes
each round's training a sleep of S seconds, which stands in for training on each
institution's own hardware: it is where the key stages, which run beside training, show
what they cost a real round (the secure round minus the plain one, in seconds).

Two costs are reported, each as a median over the measured rounds:

- the whole round (``round_seconds``): the aggregator's wall time for the round, with
  every party contending for these cores;
- each party's critical path (``party_seconds``): the wall time a collaborator spends on
  the round itself (its task handlers: downloading the model, each stage's key
  agreement, masking, signing and upload until the aggregator's receipt; its round job:
  training and encoding), measured inside its own threads, the overlap of the job with the
  key stages counted once, so the time it waits for the other parties between stages is
  not in it (the time its RPCs wait for these two cores, which every party's threads and
  the aggregator share here, is). ``party_seconds`` is the median over parties of each
  party's median over rounds; ``party_cpu_seconds`` is the same for its threads' CPU time;
- the aggregator's CPU per round (``aggregator_cpu_seconds``, with `--processes` only: with
  threads the process's CPU, ``process_cpu_seconds``, includes every party's); with `--processes` also each
  party process's CPU on the round, every thread of it (gRPC's included) from its first handler's start to its
  last one's end (``party_process_cpu_seconds``, the median over parties of each one's median over rounds);
  the whole federation's CPU per round (``federation_cpu_seconds``, ``federation_cpu_ratio_to_plain``): with
  threads the process's, with processes the aggregator's and every party process's summed: CPU seconds, which a
  host with fewer cores than parties distorts far less than it distorts wall time; and, per
  configuration, the peak resident memory of this process (``peak_rss_mb``, from the configuration's start, the
  previous configuration's garbage collected first) and of the
  largest party process (``party_peak_rss_mb``, `--processes`), its resident memory as its first round
  starts (``party_startup_rss_mb``: imports, configuration, identity, the plan, the compiled kernels and the
  update it will send, which stands in for the model a real collaborator holds by then) and what the rounds
  add to that, in float32 copies of the model, 4 d bytes each (``party_model_copies``, the largest over the
  parties; ``party_copies_since_process_start`` counts from the process's start instead, before the plan,
  the kernels and the update).

A secure party must draw one AES-CTR keystream of d + 1 words per mask (its own and one per
neighbour of the plan's default graph), whatever the implementation; ``party_cpu_beyond_masks``
is the party-CPU ratio once that keystream, timed on this machine, is taken out of the secure
side: what the protocol and the runtime add.

Secure sums run in 16-bit words (`--modulus-bits` to change; the plan's clip is 0.05 per unit of weight,
the fixed update's five standard deviations, with the finest step whose sum cannot wrap), and every
result carries ``bits_per_coordinate``: what the aggregator received in the round, in bits, over
parties x d (the masked words plus every stage's keys, shares and signatures; plain rounds send a float32
model's update in float32, as this bench's is).
`--secure-only` leaves the plain federations out (and so the ratios), for a d whose plain round this
machine cannot hold.

Each configuration runs one warm-up round, then `--rounds` measured rounds (2 with
`--quick`, 5 by default); `ratio_to_plain` (whole round) and `party_ratio_to_plain`
(critical path) are secure / plain for each (d, n). `--dimensions` and `--parties`
pick configurations. With `--pairs K` each (d, n) runs K plain-then-secure pairs of
federations, alternating, so that a machine whose speed drifts during the run (a shared
one) slows both settings alike: the round times of every pair are pooled before the
median, the critical path is the median of the runs', and ``pair_ratios`` keeps each
pair's own ratios. Output is JSON on stdout and, with `--json PATH`, in that file.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from published import publish
from round_bench_parties import (
    BATCH,
    TRAIN_SECONDS,
    available_memory,
    memory_refusal,
    party_medians,
    peak_rss_mb,
    reset_peak_rss,
    run_parties,
)
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.local.workspace import make_workspace, site_names
from fedfair.runtime.plan.limits import MAX_FEATURES, MAX_PARAMETERS
from fedfair.secagg.encode import MODULUS_BITS as MODULUS_BITS_CHOICES
from fedfair.secagg.encode import largest_safe_fractional_bits
from fedfair.secagg.graph import default_degree
from fedfair.secagg.prg import Keystream

DIMENSIONS = (10**4, 10**6)
PARTIES = (3, 10, 20, 50, 100)
CLIP = 0.05
"""The plan's clip per unit of weight: five standard deviations of the fixed update's coordinates (0.01 randn)."""
MODULUS_BITS = 16
"""The secure sum's word size unless --modulus-bits says otherwise: 16 bits a coordinate on the wire."""


def secure_aggregation(parties: int, secure: bool, modulus_bits: int) -> dict[str, Any]:
    """The plan's [secure_aggregation]: words of `modulus_bits`, the clip and weight the fixed updates need, and
    the finest step whose sum of `parties` inputs cannot wrap."""
    bits = largest_safe_fractional_bits(CLIP, modulus_bits, parties, BATCH)
    return {
        "enabled": secure,
        "modulus_bits": modulus_bits,
        "fractional_bits": bits,
        "clip": CLIP,
        "max_weight": BATCH,
    }


def run_configuration(
    dimension: int, parties: int, secure: bool, rounds: int, processes: bool = False, modulus_bits: int = MODULUS_BITS
) -> dict[str, Any]:
    """One federation of `rounds` + 1 rounds; the median of the measured rounds."""
    with tempfile.TemporaryDirectory(prefix="fedfair-round-bench-") as folder:
        names = site_names(parties)
        workspace = make_workspace(
            Path(folder),
            names,
            plan={
                "model": logistic_shape(dimension),
                "training": {"rounds": rounds + 1},
                # The parties train nothing (BenchCollaborator): no sizes to declare, no update to bound.
                "influence": {"weights": "equal", "update_norm": 1e6},
                "secure_aggregation": secure_aggregation(parties, secure, modulus_bits),
                "quorum": {"min_collaborators": parties, "round_timeout_seconds": 600.0},
            },
        )
        # The previous configuration's parties (threads of this process) sit in reference cycles with their fixed
        # updates, 4 d bytes each, until a full collection: freed now, its federation's garbage is not in this one's peak.
        gc.collect()
        reset_peak_rss()
        started = time.perf_counter()
        busy, party_peaks = run_parties(workspace.plan, [workspace.configs[name] for name in names], processes)
        total = time.perf_counter() - started
        log = read_round_log(workspace.output)
    if any(record["status"] != "applied" for record in log):
        raise RuntimeError(f"a round failed at d={dimension}, n={parties}: {log}")
    measured = [record["seconds"] for record in log[1:]]
    party_seconds, party_cpu_seconds, per_party = party_medians(busy, [record["round"] for record in log[1:]])
    stages = {
        stage: statistics.median(record["stage_seconds"][stage] for record in log[1:])
        for stage in log[-1]["stage_seconds"]
    }
    # With the parties as processes of their own, this process is the aggregator: its CPU per round and
    # its peak memory are the aggregator's; with threads they include every party's (the parties' own
    # handler CPU cannot be subtracted: gRPC does part of their work on threads they do not time).
    process_cpu = [record["cpu_seconds"] for record in log[1:]]
    # The whole federation's CPU on a round: with threads, this process's; with processes, the aggregator's and
    # every party process's, each party's every thread (gRPC's included) from its first handler's start to its
    # last one's end on the round.
    party_process_cpu = [[party[2].get(record["round"], 0.0) for record in log[1:]] for party in busy]
    federation_cpu = [
        aggregator + (sum(party[index] for party in party_process_cpu) if processes else 0.0)
        for index, aggregator in enumerate(process_cpu)
    ]
    return {
        "dimension": dimension,
        "parties": parties,
        "secure": secure,
        "processes": processes,
        "round_seconds": statistics.median(measured),
        "round_seconds_all": measured,
        "party_seconds": party_seconds,
        "party_cpu_seconds": party_cpu_seconds,
        "party_seconds_each": per_party,
        "stage_seconds": stages,
        "aggregator_received_bytes": log[-1]["received_bytes"],
        "bits_per_coordinate": 8 * log[-1]["received_bytes"] / (parties * dimension),
        "aggregator_cpu_seconds": statistics.median(process_cpu) if processes else None,
        "process_cpu_seconds": statistics.median(process_cpu),
        "party_process_cpu_seconds": statistics.median(statistics.median(party) for party in party_process_cpu)
        if processes
        else None,
        "party_process_cpu_seconds_each": [statistics.median(party) for party in party_process_cpu]
        if processes
        else None,
        "federation_cpu_seconds": statistics.median(federation_cpu),
        "federation_cpu_seconds_all": federation_cpu,
        "peak_rss_mb": peak_rss_mb(),
        "party_peak_rss_mb": max(peak for peak, _, _ in party_peaks) if party_peaks else None,
        # What a party holds for the round beyond its start-up, in float32 copies of the model (4 d bytes each):
        # the largest over the party processes (the target is 4).
        "party_model_copies": max((peak - startup) * 2**20 / (4 * dimension) for peak, startup, _ in party_peaks)
        if party_peaks
        else None,
        "party_startup_rss_mb": max(startup for _, startup, _ in party_peaks) if party_peaks else None,
        "party_copies_since_process_start": max(
            (peak - start) * 2**20 / (4 * dimension) for peak, _, start in party_peaks
        )
        if party_peaks
        else None,
        "run_seconds": total,
    }


def logistic_shape(dimension: int) -> dict[str, int]:
    """The plan's [model] for a logistic regression of exactly `dimension` parameters.

    Binary (features + 1 parameters) while the plan's limit on features allows; beyond it (d = 10^8), the
    fewest classes k that divide d into k (features + 1) parameters with features within the limit.
    """
    if dimension - 1 <= MAX_FEATURES:
        return {"features": dimension - 1}
    for classes in range(3, 1 << 16) if dimension <= MAX_PARAMETERS else ():
        if dimension % classes == 0 and dimension // classes - 1 <= MAX_FEATURES:
            return {"features": dimension // classes - 1, "classes": classes}
    raise ValueError(f"no logistic regression within the plan's limits has {dimension} parameters")


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's runs (alternated with the other setting's) as one result: every measured
    round pooled for the whole-round median, the median of the runs' critical paths and stage times."""
    merged = dict(runs[-1])
    merged["runs"] = len(runs)
    merged["round_seconds_all"] = [seconds for run in runs for seconds in run["round_seconds_all"]]
    merged["round_seconds"] = statistics.median(merged["round_seconds_all"])
    for key in ("party_seconds", "party_cpu_seconds", "process_cpu_seconds", "federation_cpu_seconds", "run_seconds"):
        merged[key] = statistics.median(run[key] for run in runs)
    merged["federation_cpu_seconds_all"] = [seconds for run in runs for seconds in run["federation_cpu_seconds_all"]]
    if merged["aggregator_cpu_seconds"] is not None:
        for key in ("aggregator_cpu_seconds", "party_process_cpu_seconds"):
            merged[key] = statistics.median(run[key] for run in runs)
        merged["party_process_cpu_seconds_each"] = [
            seconds for run in runs for seconds in run["party_process_cpu_seconds_each"]
        ]
    merged["peak_rss_mb"] = max(run["peak_rss_mb"] for run in runs)
    merged["party_seconds_each"] = [seconds for run in runs for seconds in run["party_seconds_each"]]
    merged["stage_seconds"] = {
        stage: statistics.median(run["stage_seconds"][stage] for run in runs) for stage in runs[0]["stage_seconds"]
    }
    return merged


def mask_streams(parties: int) -> int:
    """How many keystreams a party draws to mask its input under the plan's default graph: its self
    mask and one per neighbour (k of the auto SecAgg+ graph, or everyone else on the complete one)."""
    degree = default_degree(parties, 0)
    return 1 + (parties - 1 if degree is None else degree)


def keystream_seconds(words: int, repeats: int = 5) -> float:
    """This machine's CPU seconds for one AES-CTR keystream of ``words`` 64-bit words (median of ``repeats``)."""
    buffer = memoryview(bytearray(8 * words))
    times = []
    for _ in range(repeats):
        started = time.thread_time()
        Keystream(os.urandom(32)).read_into(buffer)
        times.append(time.thread_time() - started)
    return statistics.median(times)


def extra_slopes(secure_results: list[dict[str, Any]]) -> dict[str, float]:
    """Per d, how the secure round's extra time grows with n: the slope of log(secure - plain) against
    log(n), least squares over n >= 10 (work n k with k = 2 ceil(log2 n) has slope about 1.2 over 10..100;
    the complete graph's n^2 has 2)."""
    slopes = {}
    for dimension in sorted({result["dimension"] for result in secure_results}):
        points = [
            (math.log(result["parties"]), math.log(result["extra_round_seconds"]))
            for result in secure_results
            if result["dimension"] == dimension and result["parties"] >= 10 and result["extra_round_seconds"] > 0
        ]
        if len(points) >= 2:
            slopes[f"d={dimension}"] = statistics.linear_regression(*zip(*points)).slope
    return slopes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 measured rounds per configuration")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds per configuration (default 5)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--dimensions", type=int, nargs="+", default=list(DIMENSIONS), help="model sizes d")
    parser.add_argument("--parties", type=int, nargs="+", default=list(PARTIES), help="collaborator counts n")
    parser.add_argument(
        "--processes", action="store_true", help="each collaborator in a process of its own (default: threads)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --processes, start even where the machine's available memory is below the estimated need",
    )
    parser.add_argument(
        "--pairs", type=int, default=1, help="plain-then-secure federations per configuration, alternating (default 1)"
    )
    parser.add_argument(
        "--secure-only",
        action="store_true",
        help="run only the secure federations (no plain one, so no ratios): for a d whose plain round this "
        "machine cannot hold",
    )
    parser.add_argument(
        "--modulus-bits",
        type=int,
        default=MODULUS_BITS,
        choices=MODULUS_BITS_CHOICES,
        help=f"the secure sum's word size (default {MODULUS_BITS})",
    )
    parser.add_argument(
        "--train-seconds",
        type=float,
        default=0.0,
        help="each round's stand-in for local training on the institution's own hardware: a sleep (default 0)",
    )
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    if args.train_seconds < 0:
        parser.error("--train-seconds must be at least 0")
    if args.processes and not args.force:  # before any federation: 50 processes at d = 10^6 took ~22 GB
        available = available_memory()
        for dimension in args.dimensions:
            for parties in args.parties:
                refusal = memory_refusal(dimension, parties, available)
                if refusal is not None:
                    parser.error(refusal)
    os.environ[TRAIN_SECONDS] = repr(args.train_seconds)
    rounds = args.rounds or (2 if args.quick else 5)
    logging.getLogger("fedfair").setLevel(logging.WARNING)
    results = []
    for dimension in args.dimensions:
        for parties in args.parties:
            runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
            for _ in range(args.pairs):
                for secure in (True,) if args.secure_only else (False, True):
                    result = run_configuration(dimension, parties, secure, rounds, args.processes, args.modulus_bits)
                    runs[secure].append(result)
                    print(
                        f"d={dimension:>8} n={parties:>2} {'secure' if secure else 'plain ':6} "
                        f"{result['round_seconds']:.3f} s/round, {result['party_seconds']:.3f} s per party, "
                        f"{result['bits_per_coordinate']:.1f} bits a coordinate, peak {result['peak_rss_mb']:.0f} MB"
                        + (f", federation CPU {result['federation_cpu_seconds']:.2f} s/round"),
                        file=sys.stderr,
                        flush=True,
                    )
            if args.secure_only:
                results.append(pooled(runs[True]))
                continue
            plain, secure_result = pooled(runs[False]), pooled(runs[True])
            secure_result["ratio_to_plain"] = secure_result["round_seconds"] / plain["round_seconds"]
            secure_result["party_ratio_to_plain"] = secure_result["party_seconds"] / plain["party_seconds"]
            secure_result["party_cpu_ratio_to_plain"] = secure_result["party_cpu_seconds"] / plain["party_cpu_seconds"]
            masks = mask_streams(parties)
            secure_result["party_mask_keystream_seconds"] = masks * keystream_seconds(dimension + 1)
            secure_result["party_cpu_beyond_masks_ratio_to_plain"] = (
                secure_result["party_cpu_seconds"] - secure_result["party_mask_keystream_seconds"]
            ) / plain["party_cpu_seconds"]
            secure_result["federation_cpu_ratio_to_plain"] = (
                secure_result["federation_cpu_seconds"] / plain["federation_cpu_seconds"]
            )
            if plain["aggregator_cpu_seconds"]:
                for key in ("aggregator_cpu", "party_process_cpu"):
                    secure_result[f"{key}_ratio_to_plain"] = secure_result[f"{key}_seconds"] / plain[f"{key}_seconds"]
            secure_result["extra_round_seconds"] = secure_result["round_seconds"] - plain["round_seconds"]
            secure_result["pair_ratios"] = [
                {
                    "whole_round": secure_run["round_seconds"] / plain_run["round_seconds"],
                    "per_party": secure_run["party_seconds"] / plain_run["party_seconds"],
                    "federation_cpu": secure_run["federation_cpu_seconds"] / plain_run["federation_cpu_seconds"],
                }
                for plain_run, secure_run in zip(runs[False], runs[True], strict=True)
            ]
            results += [plain, secure_result]
    compared = [result for result in results if "ratio_to_plain" in result]  # none with --secure-only
    summary = {
        "benchmark": "round_bench",
        "what": "median wall time of a training round excluding local training (whole round, and each party's "
        f"own critical path); collaborators are {'processes' if args.processes else 'threads of one process'} "
        "with real gRPC over loopback mutual TLS",
        "measured_rounds": rounds,
        "pairs": args.pairs,
        "train_seconds": args.train_seconds,
        "modulus_bits": args.modulus_bits,
        "secure_only": args.secure_only,
        "results": results,
        "ratios": {
            f"d={result['dimension']},n={result['parties']}": {
                "whole_round": result["ratio_to_plain"],
                "per_party": result["party_ratio_to_plain"],
                "party_cpu": result["party_cpu_ratio_to_plain"],
                "aggregator_cpu": result.get("aggregator_cpu_ratio_to_plain"),
                "party_process_cpu": result.get("party_process_cpu_ratio_to_plain"),
                "federation_cpu": result.get("federation_cpu_ratio_to_plain"),
                "party_cpu_beyond_masks": result["party_cpu_beyond_masks_ratio_to_plain"],
            }
            for result in compared
        },
        "extra_slope": extra_slopes(compared),
    }
    publish(summary, args.json, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
