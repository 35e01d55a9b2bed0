"""``fedfair secagg-demo``: watch secure aggregation recover a weighted mean through dropouts.

n parties (default 5) hold random update vectors and weights. They run one full
round of the six-stage protocol in this process (the real client and server state
machines, every message serialised): one party drops before masking, one after. The
demo prints what the server receives from a party (uniform-looking words), the
recovered weighted mean beside the plaintext one with their largest difference and
the derived error bound, and the time of each stage; ``--json PATH`` saves the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from fedfair.core.errors import ConfigError, FedfairError
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig, largest_safe_fractional_bits
from fedfair.secagg.messages import MaskedInput, Message
from fedfair.secagg.wire import SUM_STAGES, Stage
from fedfair.secagg.simulate import DropOut, simulate_round

_PREVIEW_WORDS = 6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options (shared by the CLI and ``examples/secagg_demo.py``)."""
    parser.add_argument("-n", "--parties", type=int, default=5, help="number of parties (default 5)")
    parser.add_argument("-d", "--dimension", type=int, default=10_000, help="update length (default 10000)")
    parser.add_argument(
        "--threshold",
        type=int,
        default=None,
        help="Shamir threshold t (default: the smallest the threshold rule allows, floor(n/2)+1 without colluders)",
    )
    parser.add_argument("--neighbours", type=int, default=None, help="SecAgg+ graph degree (default: complete graph)")
    parser.add_argument(
        "--max-colluding", type=int, default=0, help="parties that may collude with the aggregator (default 0)"
    )
    parser.add_argument("--modulus-bits", type=int, default=32, choices=(16, 32, 64), help="word size k (default 32)")
    parser.add_argument(
        "--fractional-bits", type=int, default=None, help="fixed-point bits f (default: the largest that cannot wrap)"
    )
    parser.add_argument("--clip", type=float, default=1.0, help="clip range of update coordinates (default 1)")
    parser.add_argument("--max-weight", type=float, default=100.0, help="largest party weight (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demo's random data (not of any key)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")


def handle(args: argparse.Namespace) -> int:
    """Run the demo from parsed arguments; returns the exit status."""
    report = run_demo(
        parties=args.parties,
        dimension=args.dimension,
        threshold=args.threshold,
        neighbours=args.neighbours,
        max_colluding=args.max_colluding,
        modulus_bits=args.modulus_bits,
        fractional_bits=args.fractional_bits,
        clip=args.clip,
        max_weight=args.max_weight,
        seed=args.seed,
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``examples/secagg_demo.py``: same options and errors as the CLI command."""
    parser = argparse.ArgumentParser(
        prog="secagg_demo",
        description="Run one secure-aggregation round in this process, with dropouts, and show what the server sees.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return handle(args)
    except FedfairError as error:
        print(f"secagg_demo: error: {error}", file=sys.stderr)
        return 2


def _recoverable(config: SecAggConfig, gone: set[int]) -> bool:
    """Whether every secret the server needs still has t holders after ``gone`` leave.

    On the complete graph that is n - |gone| >= t; on a SecAgg+ graph each party's
    neighbourhood must keep t of its holders.
    """
    return all(len(config.holders_of(owner) - gone) >= config.t for owner in range(1, config.size + 1))


def run_demo(
    parties: int = 5,
    dimension: int = 10_000,
    threshold: int | None = None,
    neighbours: int | None = None,
    modulus_bits: int = 32,
    fractional_bits: int | None = None,
    clip: float = 1.0,
    max_weight: float = 100.0,
    seed: int = 0,
    out: TextIO = sys.stdout,
    max_colluding: int = 0,
) -> dict[str, Any]:
    """Run and narrate one round; returns the figures written by ``--json``."""
    # Imported here: the CLI imports this module to list its commands, and scipy.stats
    # would add about a second to every ``fedfair`` invocation.
    from scipy import stats

    if parties < 2:
        raise ConfigError(f"--parties {parties} is too few; secure aggregation needs at least 2")
    if dimension < 1:
        raise ConfigError(f"--dimension {dimension} must be at least 1")
    if fractional_bits is None:
        fractional_bits = largest_safe_fractional_bits(clip, modulus_bits, parties, max_weight)
        if fractional_bits < 0:
            raise ConfigError(
                "no fractional_bits fits these settings; lower --clip or --max-weight or use --modulus-bits 64"
            )
    encoding = EncodingConfig(clip, max_weight, fractional_bits, modulus_bits)
    names = tuple(f"party-{i}" for i in range(1, parties + 1))
    config = SecAggConfig("secagg-demo", 0, names, dimension, encoding, threshold, neighbours, max_colluding)

    # Demo data only: numpy's generator is fine here, it never touches a key or a mask.
    rng = np.random.default_rng(seed)
    deltas = rng.uniform(-clip, clip, size=(parties, dimension))
    weights = rng.uniform(0.1, 1.0, size=parties) * max_weight
    # One party leaves before masking, one after, as far as the threshold allows.
    before = [2] if _recoverable(config, {2}) else []
    after = next(([p] for p in range(parties, 2, -1) if _recoverable(config, {*before, p})), [])

    encode_seconds: list[float] = []
    plain_previews: dict[int, np.ndarray] = {}

    def encoded_input(party: int) -> np.ndarray:
        weighted = weights[party - 1] * deltas[party - 1]
        start = time.perf_counter()
        encoded = config.encoder.encode(weighted, float(weights[party - 1]))
        encode_seconds.append(time.perf_counter() - start)
        plain_previews[party] = encoded[:_PREVIEW_WORDS].copy()  # masking happens in place
        return encoded

    seen: dict[int, np.ndarray] = {}

    def observe(message: Message) -> None:
        if isinstance(message, MaskedInput) and not seen:
            seen[message.sender] = np.array(message.vector)

    trace = simulate_round(config, encoded_input, DropOut({Stage.MASK: before, Stage.UNMASK: after}), observe)
    result = trace.result
    included = np.array(result.contributors) - 1
    plain_mean = (weights[included] @ deltas[included]) / weights[included].sum()
    secure_mean = result.decoded.mean()
    max_abs_error = float(np.max(np.abs(secure_mean - plain_mean)))
    error_bound = result.decoded.mean_error_bound()

    print(
        f"Secure aggregation demo: n={parties} parties, d={dimension}, threshold t={config.t} "
        f"(up to {max_colluding} colluding), "
        f"{'complete graph' if config.complete else f'{neighbours}-regular graph'}, "
        f"words mod 2^{modulus_bits}, f={fractional_bits} fractional bits",
        file=out,
    )
    print(f"Dropped before masking: {before or 'none'}; dropped after masking: {after or 'none'}", file=out)
    ((sender, masked),) = seen.items()
    words = " ".join(f"{int(w):0{modulus_bits // 4}x}" for w in masked[:_PREVIEW_WORDS])
    plain = " ".join(f"{int(w):0{modulus_bits // 4}x}" for w in plain_previews[sender])
    top_bytes = (masked >> masked.dtype.type(modulus_bits - 8)).astype(np.int64)
    p_value = float(stats.chisquare(np.bincount(top_bytes, minlength=256)).pvalue)
    print(f"Party {sender}'s encoded update : {plain} ...", file=out)
    print(f"What the server receives      : {words} ...", file=out)
    print(f"  chi-square uniformity of its {masked.size} words (top byte): p = {p_value:.3f}", file=out)
    print("Weighted mean, first coordinates:", file=out)
    print("  plaintext: " + " ".join(f"{v:+.6f}" for v in plain_mean[:_PREVIEW_WORDS]), file=out)
    print("  secure   : " + " ".join(f"{v:+.6f}" for v in secure_mean[:_PREVIEW_WORDS]), file=out)
    print(f"Max |secure - plaintext| = {max_abs_error:.3e}  (derived bound {error_bound:.3e})", file=out)
    timings: dict[str, dict[str, float]] = {
        "encode": {"clients_s": sum(encode_seconds), "server_s": 0.0},
    }
    for stage in SUM_STAGES:
        timings[stage.name.lower()] = {
            "clients_s": sum(trace.client_seconds[stage]),
            "server_s": trace.server_seconds[stage],
        }
    print("Time per stage (all parties together | server):", file=out)
    for name, spent in timings.items():
        print(f"  {name:<11} {spent['clients_s'] * 1e3:9.1f} ms | {spent['server_s'] * 1e3:8.1f} ms", file=out)
    return {
        "n": parties,
        "d": dimension,
        "threshold": config.t,
        "max_colluding": max_colluding,
        "dropped": before + after,
        "dropped_before_masking": before,
        "dropped_after_masking": after,
        "max_abs_error": max_abs_error,
        "error_bound": error_bound,
        "uniformity_p_value": p_value,
        "timings": timings,
    }
