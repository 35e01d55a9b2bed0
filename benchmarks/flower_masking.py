"""The masking of a d = 10^6 update: Flower's SecAgg+ beside fedfair's secure round, interleaved in one run.

Each side is a round of secure aggregation with nothing to train: every party sends a fixed update (0.01 randn,
weight 100), so what a round costs is the protocol's own: keys, shares, masking, the masked vectors' upload,
unmasking and decoding.

- **fedfair**: round_bench's machinery (`round_bench.run_configuration`, secure, its parties as processes of their
  own): the aggregator and real collaborators over gRPC and loopback mutual TLS, the plan's defaults (complete
  graph below 2 log2 n neighbours, threshold floor(n/2) + 1, signed keys and survivor sets), 16-bit words. Wall
  is the aggregator's round (round_seconds), CPU per party each collaborator's task handlers and round job
  (party_cpu_seconds), the server's the aggregator process's, bytes the uploads the aggregator received.
- **Flower**: Flower's own SecAgg+ (`SecAggPlusWorkflow` in `DefaultWorkflow`, driving Flower's `FedAvg`; each
  site a `ClientApp` with `secaggplus_mod`) in an in-process engine of this script, a `Grid` that hands each
  message to its node's own thread: every message is serialised by its sender with Flower's protobuf serde
  (`message_to_proto`) and parsed by its receiver, so each party's CPU (its thread's) includes its encoding, and
  the bytes are the serialised messages'. No gRPC or TLS: Flower's transport is not in its figures (fedfair's
  is), and neither is the ClientApp process its deployment engine starts per message (SecAgg+ sends four messages
  a round: docs/flower.md measures a process's start-up). Run under `make test-flower`'s environment (Flower
  pins protobuf < 7, fedfair's runtime 7), as a child of the run.

Same quantisation: fedfair encodes b_k x in fixed point, clip 0.05 per unit of weight, the finest step whose
sum of n cannot wrap 16 bits (2^-11 at n = 3); Flower gets clipping_range 0.05, max_weight 100 (so its b_k / M
is 1) and quantization_range the same number of levels over [-0.05, 0.05], modulus_range 2^16. Same dropout
tolerance: Flower's num_shares n (every site shares with every other) and reconstruction_threshold fedfair's
floor(n/2) + 1. Both clip each entry to [-0.05, 0.05]; the Flower sites' updates are inside it already, so that
the run can check SecAgg+'s mean against the exact mean: within one step.

    nice -n 3 .venv/bin/python benchmarks/flower_masking.py --json benchmarks/results/flower_masking.json

Each configuration runs one warm-up round and `--rounds` measured rounds, the median reported; `--pairs` times,
fedfair then Flower.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from published import publish

ROOT = Path(__file__).resolve().parents[1]
MODULUS_BITS = 16
"""fedfair's word on the wire (round_bench's default), and Flower's modulus_range is 2^MODULUS_BITS."""
WEIGHT = 100
"""Every party's weight b_k, and both sides' max_weight (round_bench_parties.BATCH)."""
CLIP = 0.05
"""The clip per unit of weight (round_bench.CLIP)."""


@dataclass(frozen=True)
class Quantisation:
    """The masked integers both sides send: `levels` steps over [-clip, clip] per unit of weight, summed modulo
    2^modulus_bits, and the threshold of shares that unmasks a party's secrets."""

    levels: int
    threshold: int

    @property
    def step(self) -> float:
        """One level, per unit of weight."""
        return 2 * CLIP / self.levels


def fedfair_quantisation(parties: int) -> Quantisation:
    """fedfair's plan defaults for `parties`: its fixed-point levels and its threshold (complete graph)."""
    from fedfair.secagg.config import holders_per_secret, threshold_in_force
    from fedfair.secagg.encode import largest_safe_fractional_bits
    from fedfair.secagg.graph import default_degree

    bits = largest_safe_fractional_bits(CLIP, MODULUS_BITS, parties, WEIGHT)
    holders = holders_per_secret(parties, parties, default_degree(parties, 0))
    return Quantisation(levels=round(2 * CLIP * WEIGHT * 2**bits), threshold=threshold_in_force(None, holders, 0))


def run_fedfair(dimension: int, parties: int, rounds: int) -> dict[str, Any]:
    """One secure federation through round_bench's machinery; its figures per round."""
    from round_bench import run_configuration

    result = run_configuration(dimension, parties, True, rounds, processes=True, modulus_bits=MODULUS_BITS)
    return {
        "system": "fedfair",
        "parties": parties,
        "round_seconds": result["round_seconds"],
        "party_cpu_seconds": result["party_cpu_seconds"],
        "server_cpu_seconds": result["aggregator_cpu_seconds"],
        "bytes_up": result["aggregator_received_bytes"],
        "bytes_down": None,  # round_bench counts what the aggregator receives only
    }


def run_flower(dimension: int, parties: int, rounds: int, quantisation: Quantisation, python: Path) -> dict[str, Any]:
    """One Flower federation under SecAgg+, in `python` (the Flower environment); its figures per round."""
    command = [
        str(python), __file__, "flower", str(dimension), str(parties), str(rounds),
        str(quantisation.levels), str(quantisation.threshold),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the Flower side failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.splitlines()[-1]))


def flower_side(dimension: int, parties: int, rounds: int, quantisation: Quantisation) -> dict[str, Any]:
    """Flower's SecAgg+ workflow and mod in this process, each node a thread: one warm-up round, then `rounds`."""
    from flwr.app import Context, Message, RecordDict
    from flwr.client import NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.serde import message_from_proto, message_to_proto
    from flwr.proto.message_pb2 import Message as ProtoMessage
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.serverapp import Grid
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity

    # The server's identity, which every message it makes carries (as Flower's legacy simulation sets it); a reply
    # takes its sender from the message it answers.
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID
    generator = np.random.default_rng(0)
    updates = [
        np.clip(0.01 * generator.standard_normal(dimension), -CLIP, CLIP).astype(np.float32) for _ in range(parties)
    ]

    class FixedUpdate(NumPyClient):  # type: ignore[misc]
        def __init__(self, update: np.ndarray) -> None:
            self.update = update

        def fit(self, parameters: Any, config: Any) -> tuple[list[np.ndarray], int, dict[str, Any]]:
            return [self.update], WEIGHT, {}

    node_ids = list(range(1, parties + 1))

    def site_app(update: np.ndarray) -> Any:
        def client_fn(context: Context) -> Any:
            return FixedUpdate(update).to_client()

        return ClientApp(client_fn=client_fn, mods=[secaggplus_mod])

    apps = {node: site_app(update) for node, update in zip(node_ids, updates, strict=True)}
    contexts = {node: Context(1, node, {}, RecordDict(), {}) for node in node_ids}
    workers = {node: ThreadPoolExecutor(max_workers=1) for node in node_ids}
    node_cpu = dict.fromkeys(node_ids, 0.0)

    def deliver(node: int, payload: bytes) -> bytes:
        started = time.thread_time()
        message = message_from_proto(ProtoMessage.FromString(payload))
        reply = apps[node](message, contexts[node])
        answer: bytes = message_to_proto(reply).SerializeToString()
        node_cpu[node] += time.thread_time() - started
        return answer

    class ThreadGrid(Grid):  # type: ignore[misc]
        """Each message serialised, handed to its node's thread, and the reply parsed back."""

        def __init__(self) -> None:
            self._run = Run.create_empty(1)
            self.up = self.down = 0

        def set_run(self, run: Any) -> None:
            self._run = run

        @property
        def run(self) -> Any:
            return self._run

        def create_message(
            self, content: Any, message_type: str, dst_node_id: int, group_id: str, ttl: Any = None
        ) -> Any:
            return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

        def get_node_ids(self) -> list[int]:
            return node_ids

        def push_messages(self, messages: Any) -> Any:
            raise NotImplementedError("the workflows here only send_and_receive")

        def pull_messages(self, message_ids: Any) -> Any:
            raise NotImplementedError("the workflows here only send_and_receive")

        def send_and_receive(self, messages: Any, *, timeout: Any = None) -> list[Any]:
            pending = []
            for number, message in enumerate(messages):
                message.metadata.__dict__["_message_id"] = f"{time.monotonic_ns()}-{number}"
                payload = message_to_proto(message).SerializeToString()
                self.down += len(payload)
                node = message.metadata.dst_node_id
                pending.append(workers[node].submit(deliver, node, payload))
            replies = []
            for future in pending:
                answer = future.result()
                self.up += len(answer)
                replies.append(message_from_proto(ProtoMessage.FromString(answer)))
            return replies

    grid = ThreadGrid()
    rounds_seen: list[dict[str, float]] = []

    class TimedSecAggPlus(SecAggPlusWorkflow):  # type: ignore[misc]
        """Flower's workflow, each round's wall, server CPU, node CPU and bytes recorded around it."""

        def __call__(self, grid: Any, context: Any) -> None:
            cpu_before, up, down = dict(node_cpu), grid.up, grid.down
            started, started_cpu = time.perf_counter(), time.thread_time()
            super().__call__(grid, context)
            rounds_seen.append(
                {
                    "round_seconds": time.perf_counter() - started,
                    "server_cpu_seconds": time.thread_time() - started_cpu,
                    "party_cpu_seconds": statistics.median(node_cpu[n] - cpu_before[n] for n in node_ids),
                    "bytes_up": grid.up - up,
                    "bytes_down": grid.down - down,
                }
            )

    class LastAggregate(FedAvg):  # type: ignore[misc]
        """FedAvg, keeping the weighted mean SecAgg+ revealed."""

        mean: np.ndarray | None = None

        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            aggregated = super().aggregate_fit(server_round, results, failures)
            self.mean = parameters_to_ndarrays(aggregated[0])[0]
            return aggregated

    strategy = LastAggregate(
        fraction_evaluate=0.0,
        min_fit_clients=parties,
        min_available_clients=parties,
        initial_parameters=ndarrays_to_parameters([np.zeros(dimension, np.float32)]),
    )
    workflow = TimedSecAggPlus(
        num_shares=parties,
        reconstruction_threshold=quantisation.threshold,
        max_weight=float(WEIGHT),
        clipping_range=CLIP,
        quantization_range=quantisation.levels,
        modulus_range=2**MODULUS_BITS,
    )
    server = Context(1, 0, {}, RecordDict(), {})
    legacy = LegacyContext(server, ServerConfig(num_rounds=rounds + 1), strategy)
    DefaultWorkflow(fit_workflow=workflow)(grid, legacy)
    for worker in workers.values():
        worker.shutdown()
    # The unmasked mean must be the sites' exact mean to within a step (each site's rounding is under one, and the
    # weights are equal): else the harness did not run SecAgg+ as Flower runs it.
    exact = np.mean(np.stack(updates).astype(np.float64), axis=0)
    assert strategy.mean is not None, "no round was aggregated"
    error = float(np.max(np.abs(strategy.mean - exact)))
    if error > quantisation.step:
        raise RuntimeError(
            f"SecAgg+'s mean is {error:.3g} off the exact mean, more than its step {quantisation.step:.3g}"
        )
    measured = rounds_seen[1:]
    return {
        "system": "Flower SecAgg+",
        "parties": parties,
        **{key: statistics.median(record[key] for record in measured) for key in measured[0]},
        "mean_error": error,
    }


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["flower"]:
        dimension, parties, rounds, levels, threshold = map(int, arguments[1:6])
        print(json.dumps(flower_side(dimension, parties, rounds, Quantisation(levels, threshold))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dimension", type=int, default=10**6, help="the update's size d (default 10^6)")
    parser.add_argument("--parties", type=int, nargs="+", default=[3, 10], help="sites n (default 3 10)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds after a warm-up one (default 3)")
    parser.add_argument("--pairs", type=int, default=2, help="fedfair-then-Flower runs per n (default 2)")
    parser.add_argument("--flower-venv", type=Path, default=ROOT / ".venv-flower", help="make test-flower's venv")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(arguments)
    python = args.flower_venv / "bin" / "python"
    if not python.exists():
        parser.error(f"no Python in {args.flower_venv}; build it with `make test-flower` (or pass --flower-venv)")
    runs = []
    for parties in args.parties:
        quantisation = fedfair_quantisation(parties)
        for _ in range(args.pairs):
            for side in ("fedfair", "flower"):
                if side == "fedfair":
                    run = run_fedfair(args.dimension, parties, args.rounds)
                else:
                    run = run_flower(args.dimension, parties, args.rounds, quantisation, python)
                run |= {"levels": quantisation.levels, "threshold": quantisation.threshold}
                runs.append(run)
                print(json.dumps(run), file=sys.stderr, flush=True)
    document = {
        "settings": {
            "dimension": args.dimension,
            "measured_rounds": args.rounds,
            "pairs": args.pairs,
            "weight": WEIGHT,
            "clip": CLIP,
            "modulus_bits": MODULUS_BITS,
        },
        "runs": runs,
    }
    publish(document, args.json, arguments)
    return 0


if __name__ == "__main__":
    sys.exit(main())
