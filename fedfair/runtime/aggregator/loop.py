"""The aggregator process: serve the plan over mutual TLS and run its rounds.

It serves the Federation gRPC service over mutual TLS (client certificates
required, names checked against the plan's allow-list) and drives the rounds of
FedSRCVaR from one thread. The pieces are small and separate:

- :mod:`fedfair.runtime.aggregator.servicer`: the gRPC service;
- :mod:`fedfair.runtime.aggregator.board`: the state the service shares with the driver;
- :mod:`fedfair.runtime.aggregator.driver`: one secure (or plain) sum over the network;
- :mod:`fedfair.runtime.aggregator.checkpoint`: atomic checkpoints, the round log, the final model;
- :mod:`fedfair.runtime.aggregator.lock`: one aggregator per output folder;
- :mod:`fedfair.runtime.aggregator.events`: the operator's ``events.jsonl``;
- :mod:`fedfair.runtime.aggregator.commands`: ``fedfair aggregator start --plan aggregator/plan.toml``;
- this module: serving, and the round loop (quorum, apply, evaluate, checkpoint, log).

Waiting for collaborators. Before the first round of a process (a fresh start or a
resume) the aggregator waits for the plan's quorum (``[quorum] min_collaborators``)
with no deadline, as Flower waits for ``min_available_clients``, naming every
:data:`WAIT_REPORT_SECONDS` who it still waits for (``--startup-timeout`` bounds this
wait); once the quorum is there it gives the rest of the plan up to the round timeout
to join, so a federation starts whole when it can. Each later round waits up to the
round timeout for the quorum; if it is not there, the process stops with
:class:`QuorumNotReached`, whose advice depends on whether a checkpoint exists. A
round that fails once started (a stage timing out, too few survivors) is aborted, the
model kept, and the next round runs: a timeout never ends the process.

The learning itself is `fedfair.core.server.apply`, unchanged: the aggregator turns the
decoded sum into a `server.Aggregate` and applies it, exactly as the in-process
simulation does.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import grpc
import torch
from cryptography import x509

from fedfair import pki
from fedfair.core import server
from fedfair.core.errors import ConfigError, FedfairError
from fedfair.core.models import flat_parameters
from fedfair.fairness import sums
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.aggregator.checkpoint import (
    CHECKPOINT_NAME,
    Checkpoint,
    append_round_log,
    export_final_model,
    load_checkpoint,
    read_round_log,
    save_checkpoint,
    state_digest,
    trim_round_log,
)
from fedfair.runtime.aggregator.driver import (
    DriverSettings,
    RoundAborted,
    SumDriver,
    check_decoded_update,
)
from fedfair.runtime.aggregator.events import EventLog
from fedfair.runtime.aggregator.lock import output_lock
from fedfair.runtime.aggregator.servicer import Servicer, federation_server
from fedfair.runtime.contract import EVALUATION, TRAINING
from fedfair.runtime.faults import maybe_die
from fedfair.runtime.manifest import pinned_verifier
from fedfair.runtime.plan import (
    AggregatorPlan,
    plan_digest,
    shared_settings,
)
from fedfair.runtime.transport import (
    PeerAuthenticator,
    StageGate,
    TlsFiles,
    check_tls_files,
    make_binding,
    pb,
    server_credentials,
    server_options,
)
from fedfair.secagg import check_no_wraparound

logger = logging.getLogger("fedfair.aggregator")

SERVER_KEEPALIVE = [("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 10_000)]
"""The aggregator pings quiet connections too, so a peer that vanished without closing
its connection (a cut cable rather than a killed process) is noticed within seconds."""

GOODBYE_SECONDS = 10.0
"""How long the aggregator waits for collaborators to read FINISHED before it stops serving."""

WAIT_REPORT_SECONDS = 10.0
"""How often the aggregator names the collaborators it is waiting for before a round."""

OBJECTIVE_FIGURES = ("worst_risk", "mean_risk", "best_risk", "accuracy")
"""The federated evaluation's figures a round event carries as its objective estimate."""


class QuorumNotReached(FedfairError):
    """Too few collaborators connected in time (the round timeout, or ``--startup-timeout`` before the first)."""


def initial_state(plan: AggregatorPlan) -> server.ServerState:
    """Round 0: the plan's model with its seed's initial weights, c at the bound B (as the simulation)."""
    model = plan.model.build(seed=plan.training.seed)
    return server.init(flat_parameters(model), bound=plan.objective.bound)


@dataclass
class Network:
    """The running gRPC server and what its threads share with the round loop."""

    server: grpc.Server
    port: int
    board: Board
    gate: StageGate
    ca_certificate: x509.Certificate

    def stop(self) -> None:
        self.board.close()
        self.server.stop(grace=2.0).wait()


def serve(
    plan: AggregatorPlan, digest: str, address: str | None = None, events: EventLog | None = None
) -> Network:
    """Start the mTLS gRPC server for `plan` (on `address` if given, else the plan's); return it.

    The port is never shared (no SO_REUSEPORT, see
    :func:`fedfair.runtime.transport.server_options`): a port already taken fails here, at once.
    """
    files = TlsFiles.in_folder(plan.aggregator.certs, plan.aggregator.name)
    certified = check_tls_files(files, "aggregator")
    if certified != plan.aggregator.name:
        raise ConfigError(
            f"{files.cert} certifies '{certified}', not the plan's aggregator name '{plan.aggregator.name}'; "
            "set [aggregator] name or issue the right certificate"
        )
    ca_certificate = pki.load_certificate(files.ca)
    board = Board(digest)
    gate = StageGate(plan.federation_id)
    gate.open(0, pb.STAGE_JOIN)
    servicer = Servicer(
        board, gate, PeerAuthenticator(ca_certificate, plan.collaborators), shared_settings(plan), events=events
    )
    grpc_server = federation_server(servicer, len(plan.collaborators), server_options() + SERVER_KEEPALIVE)
    target = address or plan.aggregator.address
    try:
        port = grpc_server.add_secure_port(target, server_credentials(files))
    except RuntimeError:
        port = 0
    if port == 0:
        raise ConfigError(
            f"cannot listen on {target}: the port is in use (another aggregator? `ss -ltnp` names the process) "
            "or the host is not an address of this machine; stop the other process or choose another "
            "--address"
        )
    grpc_server.start()
    return Network(grpc_server, port, board, gate, ca_certificate)


class RoundLoop:
    """The rounds of one federation: quorum, train, apply, evaluate, checkpoint, log."""

    def __init__(
        self,
        plan: AggregatorPlan,
        network: Network,
        checkpoint: Checkpoint,
        events: EventLog | None = None,
        *,
        startup_timeout: float = 0.0,
    ) -> None:
        self.plan = plan
        self.network = network
        self.checkpoint = checkpoint
        self.events = events or EventLog(plan.aggregator.output)
        self.startup_timeout = startup_timeout
        """Seconds the first round of this process waits for the quorum (0: no deadline)."""
        self.output = plan.aggregator.output
        secure = plan.secure_aggregation
        self.encoding = secure.encoding()
        self.driver = SumDriver(
            network.board,
            network.gate,
            DriverSettings(
                federation_id=plan.federation_id,
                secure=secure.enabled,
                threshold=secure.threshold,
                neighbours=secure.mask_neighbours,
                max_colluding=secure.max_colluding,
                stage_timeout=plan.quorum.round_timeout_seconds,
            ),
            # Under a manifest the aggregator checks relayed certificates against the pins too, so a
            # twin is refused at the door (the collaborators check again themselves).
            pki.credential_verifier(network.ca_certificate, "collaborator")
            if plan.manifest is None
            else pinned_verifier(plan.manifest, network.ca_certificate),
        )
        self.average_from = plan.training.average_from_round
        self.evaluation = checkpoint.evaluation
        self.excluded = excluded_in(read_round_log(self.output))
        """Collaborators left out of every later round, with why (rebuilt from the round log on resume)."""

    def run(self) -> dict[str, Any]:
        """Run the remaining rounds, export the final model, say FINISHED; return the summary.

        A run resumed from the checkpoint of round r starts at round r + 1, so a round
        that was in flight when the aggregator died is run again from the start, with
        the model it started from; its collaborators take part again (they re-send the
        update they trained on that model, see `fedfair.runtime.collaborator.client`).
        """
        rounds = self.plan.training.rounds
        first = self.checkpoint.round + 1
        if first > 1:
            logger.info("resuming at round %d from the checkpoint of round %d", first, self.checkpoint.round)
        for round_number in range(first, rounds + 1):
            record = self.train(round_number, wait_for_everyone=round_number == first)
            if self._evaluation_due(round_number):
                record["evaluation"] = self.evaluate(round_number)
            self._round_event(record)
            self.checkpoint = Checkpoint(
                round_number, self.checkpoint.state, self.checkpoint.plan_digest, self.evaluation
            )
            # The record first: a crash between the two leaves a record that a resume trims, whereas
            # the other order could leave a checkpointed round that the log never mentions.
            append_round_log(self.output, record)
            save_checkpoint(self.output, self.checkpoint)
            maybe_die("after-checkpoint", round_number)
        summary = {
            "federation_id": self.plan.federation_id,
            "secure_aggregation": self.plan.secure_aggregation.enabled,
            "evaluation": self.evaluation,
        }
        export_final_model(self.output, self.checkpoint, summary)
        logger.info("finished %d rounds; final model in %s", rounds, self.output)
        self.events.emit("finish", rounds=rounds, output=str(self.output))
        self.network.board.finish(make_binding(self.plan.federation_id, rounds, pb.STAGE_EVAL_UNMASK))
        return summary

    def _evaluation_due(self, round_number: int) -> bool:
        every = self.plan.evaluation.every
        return round_number == self.plan.training.rounds or (every > 0 and round_number % every == 0)

    def _round_event(self, record: dict[str, Any]) -> None:
        """The ``round`` event of a finished (applied or aborted) round: see :mod:`.events`."""
        evaluation = self.evaluation or {}
        objective = (
            {"round": evaluation.get("round"), **{key: evaluation.get(key) for key in OBJECTIVE_FIGURES}}
            if evaluation.get("status") == "done"
            else None
        )
        self.events.emit(
            "round",
            round=record["round"],
            status=record["status"],
            participants=record["participants"],
            contributors=record.get("contributors", []),
            seconds={**record.get("stage_seconds", {}), "total": record.get("seconds")},
            bytes=record.get("received_bytes", 0),
            objective=objective,
            epsilon=self.network.board.epsilons(),
        )

    def _participants(self, round_number: int, *, wait_for_everyone: bool) -> frozenset[str]:
        """Who takes part: collaborators with a live task stream, at least the quorum of them.

        The first round of a process waits for the quorum under the start-up rules, then for
        the rest of the plan up to the round timeout (see the module's notes); later rounds
        wait up to the round timeout for the quorum and start with whoever is there.
        """
        quorum = self.plan.quorum
        eligible = frozenset(self.plan.collaborators) - self.excluded.keys()
        if len(eligible) < quorum.min_collaborators:
            raise QuorumNotReached(
                f"round {round_number}: {len(self.excluded)} collaborators are excluded "
                f"({', '.join(sorted(self.excluded))}), which leaves {len(eligible)}, below the quorum of "
                f"{quorum.min_collaborators}; the federation cannot go on with this plan (see rounds.jsonl for "
                "why they were excluded)"
            )
        if wait_for_everyone:
            startup = self.startup_timeout or None
            self._wait_for(round_number, quorum.min_collaborators, eligible, startup, "the quorum")
            connected = self._wait_for(
                round_number, len(eligible), eligible, quorum.round_timeout_seconds, "everyone"
            )
        else:
            connected = self._wait_for(
                round_number, quorum.min_collaborators, eligible, quorum.round_timeout_seconds, "the quorum"
            )
        missing = eligible - connected
        if missing:
            logger.info(
                "round %d starts with %d of %d collaborators; missing %s",
                round_number,
                len(connected),
                len(eligible),
                ", ".join(sorted(missing)),
            )
        return connected

    def _wait_for(
        self, round_number: int, count: int, eligible: frozenset[str], timeout: float | None, goal: str
    ) -> frozenset[str]:
        """Wait until `count` of `eligible` are connected, naming who is missing every WAIT_REPORT_SECONDS.

        `timeout` None waits without a deadline. Returns who is connected then; raises
        QuorumNotReached if that is below the quorum when the time is up.
        """
        board, quorum = self.network.board, self.plan.quorum
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            step = WAIT_REPORT_SECONDS if left is None else max(min(WAIT_REPORT_SECONDS, left), 0.0)
            connected = board.wait_for_connected(count, step, among=eligible)
            if len(connected) >= count or board.closed or (left is not None and left <= step):
                break
            logger.info(
                "round %d: waiting for %s: %d of %d collaborators connected, missing %s; %s",
                round_number,
                goal,
                len(connected),
                len(eligible),
                ", ".join(sorted(eligible - connected)),
                "no deadline"
                if deadline is None
                else f"{max(deadline - time.monotonic(), 0.0):.0f} s left",
            )
        if len(connected) < quorum.min_collaborators:
            raise QuorumNotReached(self._quorum_failure(round_number, connected, eligible, timeout))
        return connected

    def _quorum_failure(
        self, round_number: int, connected: frozenset[str], eligible: frozenset[str], timeout: float | None
    ) -> str:
        """The message of QuorumNotReached, with the advice that works from where the run stands."""
        quorum = self.plan.quorum
        missing = ", ".join(sorted(eligible - connected)) or "none"
        what = (
            f"round {round_number}: only {len(connected)} of the {len(eligible)} collaborators connected "
            f"within {timeout or 0:g} s, below the quorum of {quorum.min_collaborators} (missing: {missing})"
        )
        if (self.output / CHECKPOINT_NAME).exists():
            return (
                f"{what}. The checkpoint of round {self.checkpoint.round} is kept in {self.output}: start the "
                "missing collaborators (their logs say why they stopped), then restart the aggregator with "
                "--resume"
            )
        return (
            f"{what}. Nothing was trained yet. Check that the missing collaborators are running, dial this "
            "aggregator's address, and hold certificates from this federation's CA with the names listed in "
            "[federation] collaborators (their logs say why they cannot connect); then start the aggregator "
            "again, without --resume (there is no checkpoint yet), and without --startup-timeout to wait for "
            "them as long as it takes"
        )

    def _exclude(self, round_number: int, culprits: dict[str, str], record: dict[str, Any]) -> None:
        """Leave the round's culprits out of every later round; say so in the log and in `record`."""
        new = {name: why for name, why in culprits.items() if name not in self.excluded}
        for name, why in new.items():
            logger.error(
                "round %d: %s misbehaved in secure aggregation (%s); it is excluded from the rest of the "
                "federation (restart the aggregator with --resume after the institutions have settled it)",
                round_number,
                name,
                why,
            )
        if new:
            self.excluded.update(new)
            record["excluded"] = new
            for name, why in new.items():
                self.events.emit("exclusion", round=round_number, name=name, reason=why)

    def train(self, round_number: int, *, wait_for_everyone: bool = False) -> dict[str, Any]:
        """One training round; the model changes only if the round completes and passes the checks."""
        participants = self._participants(round_number, wait_for_everyone=wait_for_everyone)
        state = self.checkpoint.state
        started = time.perf_counter()
        self.network.board.new_round(round_number)
        record: dict[str, Any] = {
            "round": round_number,
            "participants": sorted(participants),
            "model_sha256": state_digest(state),
            "secure_aggregation": self.plan.secure_aggregation.enabled,
        }
        model = (state.theta.numpy(), state.c)
        try:
            outcome = self.driver.run(
                round_number, TRAINING, participants, state.theta.numel() + 1, self.encoding, model
            )
            clip = self.encoding.clip if self.plan.secure_aggregation.enabled else None
            check_decoded_update(outcome, clip, len(outcome.contributors))
            aggregate = server.Aggregate.from_vector(torch.from_numpy(outcome.weighted_sum), outcome.total_weight)
            state = server.apply(state, aggregate, bound=self.plan.objective.bound, average_from=self.average_from)
        except (RoundAborted, server.AggregateError) as error:
            record.update(status="aborted", reason=str(error), seconds=time.perf_counter() - started)
            logger.warning("round %d aborted, model unchanged: %s", round_number, error)
            if isinstance(error, RoundAborted):
                self._exclude(round_number, error.culprits, record)
            return record
        self._exclude(round_number, outcome.culprits, record)
        self.checkpoint = Checkpoint(self.checkpoint.round, state, self.checkpoint.plan_digest, self.evaluation)
        record.update(
            status="applied",
            contributors=list(outcome.contributors),
            dropped=outcome.dropped,
            total_weight=outcome.total_weight,
            mean_update_error_bound=outcome.error_bound * (1.0 + self.encoding.clip) / outcome.total_weight,
            c=state.c,
            c_average=state.c_average,
            received_bytes=outcome.received_bytes,
            stage_seconds=outcome.stage_seconds,
            seconds=time.perf_counter() - started,
        )
        logger.info(
            "round %d applied: %d of %d participants contributed, total weight %.6g, c = %.5f (%.2f s)",
            round_number,
            len(outcome.contributors),
            len(participants),
            outcome.total_weight,
            state.c,
            record["seconds"],
        )
        return record

    def evaluate(self, round_number: int) -> dict[str, Any]:
        """Federated worst / best / mean test risk of the output model (theta-bar, c-bar), from secure sums."""
        board, state = self.network.board, self.checkpoint.state
        participants = board.connected() - self.excluded.keys()
        needed = max(self.plan.quorum.min_collaborators, 2 if self.plan.secure_aggregation.enabled else 1)
        if len(participants) < needed:
            logger.warning(
                "round %d: evaluation skipped, only %d collaborators connected", round_number, len(participants)
            )
            return {"status": "skipped", "reason": "too few collaborators connected"}
        model = (state.theta_average.numpy(), state.c_average)
        try:
            outcome = self.driver.run(
                round_number, EVALUATION, participants, sums.vector_length(), sums.ENCODING, model
            )
            report = sums.report_from_sums(
                outcome.weighted_sum,
                self.plan.evaluation.thresholds(),
                self.plan.objective.rho,
                min_bucket_count=self.plan.evaluation.min_bucket_count,
                sum_error=outcome.error_bound,
            )
        except (RoundAborted, ConfigError) as error:
            logger.warning("round %d: evaluation aborted: %s", round_number, error)
            aborted: dict[str, Any] = {"status": "aborted", "reason": str(error)}
            if isinstance(error, RoundAborted):
                self._exclude(round_number, error.culprits, aborted)
            return aborted
        result = {
            "status": "done",
            "round": round_number,
            "collaborators": len(outcome.contributors),
            **report.to_dict(),
        }
        self._exclude(round_number, outcome.culprits, result)
        self.evaluation = result
        logger.info(
            "round %d evaluation (held-out, rho = %g): worst %.4f, mean %.4f, best %.4f, accuracy %.4f",
            round_number,
            report.rho,
            report.worst_risk,
            report.mean_risk,
            report.best_risk,
            report.accuracy,
        )
        return result


def excluded_in(records: list[dict[str, Any]]) -> dict[str, str]:
    """The collaborators a run excluded so far, from its round log (training and evaluation records)."""
    excluded: dict[str, str] = {}
    for record in records:
        for source in (record, record.get("evaluation") or {}):
            excluded.update(source.get("excluded") or {})
    return excluded


def prepare(plan: AggregatorPlan, *, resume: bool) -> Checkpoint:
    """Check what must hold before serving; return the state to start from."""
    if plan.secure_aggregation.enabled:
        n = len(plan.collaborators)
        # Both kinds of sum run under secure aggregation: the training updates and the evaluation answers.
        for encoding in (plan.secure_aggregation.encoding(), sums.ENCODING):
            check_no_wraparound(encoding.clip, encoding.fractional_bits, encoding.modulus_bits, n, encoding.max_weight)
    digest = plan_digest(plan)
    output = plan.aggregator.output
    if resume:
        checkpoint = load_checkpoint(output, digest)
        if checkpoint.round > plan.training.rounds:
            raise ConfigError(
                f"the checkpoint is at round {checkpoint.round}, past the plan's {plan.training.rounds} rounds"
            )
        dropped = trim_round_log(output, checkpoint.round)
        if dropped:
            logger.info("dropped %d round-log lines past the checkpoint's round %d", dropped, checkpoint.round)
        return checkpoint
    if (output / "checkpoint.pt").exists():
        raise ConfigError(
            f"{output} holds a checkpoint from an earlier run; pass --resume to continue it, "
            "or choose another output folder (--output)"
        )
    return Checkpoint(0, initial_state(plan), digest)


def run_aggregator(
    plan: AggregatorPlan, *, resume: bool = False, address: str | None = None, startup_timeout: float = 0.0
) -> dict[str, Any]:
    """Serve and run a whole federation; return the final summary.

    The output folder's lock (:func:`~fedfair.runtime.aggregator.lock.output_lock`) is
    taken before anything is read or written there, and held until the server has stopped.
    `startup_timeout` bounds the first round's wait for the quorum (0: no deadline).
    """
    with output_lock(plan.aggregator.output):
        checkpoint = prepare(plan, resume=resume)
        events = EventLog(plan.aggregator.output)
        network = serve(plan, checkpoint.plan_digest, address, events)
        logger.info(
            "aggregator for federation %s listening on port %d (mutual TLS; %d collaborators allowed; secure "
            "aggregation %s; PID %d)",
            plan.federation_id,
            network.port,
            len(plan.collaborators),
            "on" if plan.secure_aggregation.enabled else "OFF",
            os.getpid(),
        )
        events.emit(
            "start",
            federation_id=plan.federation_id,
            pid=os.getpid(),
            resume=resume,
            first_round=checkpoint.round + 1,
            rounds=plan.training.rounds,
            collaborators=list(plan.collaborators),
        )
        try:
            summary = RoundLoop(plan, network, checkpoint, events, startup_timeout=startup_timeout).run()
            # Give collaborators a bounded moment to read FINISHED and hang up.
            network.board.wait_until_alone(GOODBYE_SECONDS)
            return summary
        finally:
            network.stop()
