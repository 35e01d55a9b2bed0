"""The round loop: quorum, train, apply, evaluate, checkpoint, log, from one thread.

The learning itself is the plan's `fedfair.core.algorithm.FedSRCVaR`: the aggregator turns the
decoded sum into a `server.Aggregate` and applies it, exactly as the in-process simulation does.

Why: docs/design.md, "Inside the aggregator".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any


from fedfair import pki
from fedfair.core.errors import AggregateError, ConfigError, RoundAbortedError, StatisticsError, StatisticsReason
from fedfair.runtime.aggregator.voided import BoundSurvivors
from fedfair.runtime.aggregator.bundles import (
    checkpoint_encoder,
    model_settings,
    save_federation_bundle,
)
from fedfair.runtime.plan.input_bound import prepare_verification
from fedfair.runtime.output_folder import CHECKPOINT_NAME
from fedfair.runtime.aggregator.checkpoint import (
    Checkpoint,
    append_round_log,
    excluded_in as excluded_in,  # re-exported: fedfair.cli.aggregator and tests read it here
    export_final_model,
    read_round_log,
    save_checkpoint,
    state_digest,
)
from fedfair.runtime.aggregator.checks import check_agreed_influence, check_decoded_update, screen_plain_update
from fedfair.runtime.aggregator.driver import DriverSettings, SumDriver
from fedfair.runtime.aggregator.evaluation import federated_evaluation
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.observe.logs import per_round
from fedfair.runtime.aggregator.network import Network
from fedfair.runtime.aggregator.round_identities import aggregator_identities
from fedfair.runtime.aggregator.quorum import participants
from fedfair.runtime.aggregator.state import output_values, parameters, placed, step, training_values
from fedfair.runtime.aggregator.statistics import statistics_checkpoint
from fedfair.core.update import update_dimension
from fedfair.runtime.contract import (
    EVALUATION,
    training_stages,
    model_digest,
)
from fedfair.runtime.evaluation_figures import Earlier
from fedfair.runtime.faults import maybe_die
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan
from fedfair.runtime.plan.kind_checks import check_plan_at_size
from fedfair.runtime.preprocessing import STATISTICS_ROUND, encoder_payload
from fedfair.runtime.report import verdicts
from fedfair.runtime.state_files import holding
from fedfair.runtime.transport import make_binding
from fedfair.secagg.graph import canonical_roster

logger = logging.getLogger("fedfair.aggregator")

OBJECTIVE_FIGURES = ("worst_risk", "mean_risk", "best_risk", "accuracy")
"""The federated evaluation's figures a round event carries as its objective estimate."""


STATISTICS_RETRY_SECONDS = 1.0
"""The pause before the first re-run of an aborted statistics aggregation; it doubles with every
abort in a row (up to the round timeout), so parties that keep refusing do not make the loop spin."""


class RoundLoop:
    """The rounds of one federation: quorum, train, apply, evaluate, checkpoint, log."""

    def __init__(
        self,
        plan: AggregatorPlan,
        network: Network,
        checkpoint: Checkpoint | None,
        events: EventLog | None = None,
        *,
        startup_timeout: float = 0.0,
        serve_again: Callable[[Network], Network] | None = None,
    ) -> None:
        """`checkpoint` None.

        A fresh federation with a [schema], whose statistics aggregation makes the encoder and the initial model
        when :meth:`run` starts. `serve_again(network)` stops `network` and serves anew on its port; without it
        an aborted statistics aggregation ends the run.
        """
        self.plan = plan
        self.network = network
        self._start = checkpoint
        self.checkpoint: Checkpoint
        self.start_input = b""
        """What every start stage offers for fetching: the encoder's JSON under a [schema]."""
        self.events = events or EventLog(plan.aggregator.output)
        self.startup_timeout = startup_timeout
        """Seconds the first round of this process waits for the quorum (0: no deadline)."""
        self.output = plan.aggregator.output
        self.encoding = plan.secure_aggregation.encoding()
        self._serve_again = serve_again
        self.driver = self._driver()
        self.average_from = plan.training.average_from_round
        self.algorithm = plan.algorithm()
        self.evaluation = None if checkpoint is None else checkpoint.evaluation
        done = self.evaluation if self.evaluation is not None and "model" in self.evaluation else None
        self.asked = None if done is None else Earlier(done["model"], done.get("answers_of_round", done["round"]), None)
        """The model last evaluated, from its first ask (contributors unknown after a restart): whose answers it has."""
        self.records = read_round_log(self.output)
        """Every round's record so far: the model bundle's metrics and provenance."""
        self.excluded = excluded_in(self.records)
        self.bound = BoundSurvivors()
        """After a round voided once its sum was unmasked, the survivors this model is bound to."""
        """Collaborators left out of every later round, with why (rebuilt from the round log on resume,
        less those an operator re-admitted with ``--readmit``)."""

    @property
    def starting_checkpoint(self) -> Checkpoint | None:
        """The checkpoint :meth:`run` starts from, until it starts (None: a [schema]'s statistics make it then)."""
        return self._start

    def _driver(self) -> SumDriver:
        """The sum driver over the current network's board and gate."""
        secure = self.plan.secure_aggregation
        return SumDriver(
            self.network.board,
            self.network.gate,
            DriverSettings(
                federation_id=self.plan.federation_id,
                secure=secure.enabled,
                security=secure.security(len(self.plan.collaborators)),
                graph_roster=canonical_roster(self.plan.collaborators),
                stage_timeout=self.plan.quorum.round_timeout_seconds,
                grace=self.plan.quorum.grace_factor,
                tolerates_dropouts=secure.tolerates_dropouts,
                folder=self.output,
                identities=aggregator_identities(self.plan, (self.network.authenticator, self.network.auditor)),
            ),
            # Under a manifest the aggregator checks relayed certificates against the pins in force too, so
            # a twin or a revoked key is refused at the door (the collaborators check again themselves).
            pki.credential_verifier(self.network.ca_certificate, "collaborator")
            if self.network.manifest is None
            else self.network.manifest,
        )

    def run(self) -> dict[str, Any]:
        """Run the remaining rounds, export the final model, say FINISHED; return the summary.

        A run resumed from the checkpoint of round r starts at round r + 1, so a round
        that was in flight when the aggregator died is run again from the start, with
        the model it started from; its collaborators take part again (they re-send the
        update they trained on that model, see `fedfair.runtime.collaborator.rounds`).
        """
        rounds = self.plan.training.rounds
        prepare_verification(self.plan.secure_aggregation, "aggregator")  # while the sites connect
        start = self._start if self._start is not None else self._statistics()
        # A large model's state goes into a file in the output folder, read by span from here on (.state).
        self.checkpoint = dataclasses.replace(start, state=placed(start.state, self.algorithm, self.output))
        del start
        self._start = None  # round 0's model (two float64 copies) goes once a round replaces self.checkpoint
        # The model's size is known only now (a [schema]'s statistics make the model): a plan the training kind
        # cannot run at this size stops the federation here, naming it, rather than every party at every round.
        check_plan_at_size(
            self.plan, len(self.plan.collaborators), str(self.plan.source), parameters(self.checkpoint.state)
        )
        encoder = checkpoint_encoder(self.checkpoint)
        self.start_input = b"" if encoder is None else encoder_payload(encoder)
        first = self.checkpoint.round + 1
        if first > 1:
            logger.info("resuming at round %d from the checkpoint of round %d", first, self.checkpoint.round)
        for round_number in range(first, rounds + 1):
            self.network.take_manifest_update()
            record = self.train(round_number, wait_for_everyone=round_number == first)
            record.update(answer_seconds=self.driver.answers, held_up_by=self.driver.laggards(round_number))
            if self.evaluation_due(round_number):
                record["evaluation"] = self.evaluate(round_number)
            self.checkpoint = dataclasses.replace(self.checkpoint, round=round_number, evaluation=self.evaluation)
            # The record first: a crash between the two leaves a record that a resume trims, whereas
            # the other order could leave a checkpointed round that the log never mentions.
            append_round_log(self.output, record)
            # The event after the log, which aborts an evaluation whose figures are not finite: the event's
            # objective then agrees with the log's (none), not with the figures before they were nulled.
            self._round_event(record)
            self.records.append(record)
            save_checkpoint(self.output, self.checkpoint)
            save_federation_bundle(self.plan, self.checkpoint, self.records)
            maybe_die("after-checkpoint", round_number)
        # The state counts the server steps applied; a round that aborted left the model as it was.
        aborted = rounds - self.checkpoint.state.round
        summary = {
            "federation_id": self.plan.federation_id,
            "secure_aggregation": self.plan.secure_aggregation.enabled,
            "evaluation": self.evaluation,
            "aborted_rounds": aborted,
        }
        export_final_model(self.output, self.checkpoint, summary)
        bundle = save_federation_bundle(self.plan, self.checkpoint, self.records)
        final = self.evaluation or {}
        if final.get("status") == "done":
            logger.info("final evaluation of round %d (held-out): %s", final["round"], verdicts.describe(final))
            for warning in (check(final) for check in verdicts.WARNINGS):
                if warning is not None:
                    logger.warning("finished with a warning: %s", warning)
        self.events.emit("finish", rounds=rounds, output=str(self.output))
        # Every collaborator that reads FINISHED may fetch the bundle: the federation's model is theirs too.
        self.network.board.finish(
            make_binding(self.plan.federation_id, rounds, EVALUATION.sum_end), bundle.read_bytes()
        )
        return summary

    def _statistics(self) -> Checkpoint:
        """:meth:`federate_statistics` until it gives the encoder.

        An aborted run (parties that left, withdrew or misbehaved) waits for the quorum and runs again, as an
        aborted round is followed by the next, so collaborators that stopped and come back find the aggregator
        still there.

        Round 0 runs again under a new server (`serve_again`): stages only move forward on a gate, and
        a fresh board and gate, as a restarted process has, let no upload of the aborted run into the
        re-run; connected collaborators reconnect on their own. Its culprits sit the re-runs out, in
        this process only (the round log starts with round 1).
        """
        attempt = 0
        while True:
            try:
                return self.federate_statistics()
            except StatisticsError as error:
                if error.reason is not StatisticsReason.ABORTED or self._serve_again is None:
                    raise
                for name, why in error.culprits.items():
                    logger.error(
                        "statistics aggregation: %s misbehaved (%s); it sits out this process's rounds", name, why
                    )
                    self.excluded[name] = why
                    self.events.emit("exclusion", round=STATISTICS_ROUND, name=name, reason=why)
                pause = min(STATISTICS_RETRY_SECONDS * 2.0**attempt, self.plan.quorum.round_timeout_seconds)
                logger.warning(
                    "%s; serving afresh, it runs again once the quorum is connected (in %.0f s at the earliest)",
                    error,
                    pause,
                )
                self.network = self._serve_again(self.network)
                self.driver = self._driver()
                attempt += 1
                time.sleep(pause)

    def federate_statistics(self) -> Checkpoint:
        """Run the statistics aggregation (round 0) of a fresh federation with a [schema].

        One secure sum of every site's counts and sums (:mod:`fedfair.runtime.preprocessing`)
        gives the encoder all sites share and, from it, the initial model.

        Its checkpoint (round 0, with the encoder) is saved at once, so a resumed run serves
        the same encoder. One attempt: it raises StatisticsError, ABORTED (which
        :meth:`_statistics` retries) or NO_ENCODER (a sum that gives no encoder).
        """
        participants = self.choose_participants(STATISTICS_ROUND, wait_for_everyone=True)
        self.network.board.new_round(STATISTICS_ROUND)
        return statistics_checkpoint(self.plan, self.driver, participants, self.events)

    def evaluation_due(self, round_number: int) -> bool:
        """Whether the federated evaluation runs after training round `round_number`: the plan's [evaluation].

        A public seam: an override (or a wrapper set on the instance) may ask every round, or none.
        """
        return self.plan.evaluation.due(round_number, self.plan.training.rounds)

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
            held_up_by=record.get("held_up_by", {}),
        )

    def choose_participants(self, round_number: int, *, wait_for_everyone: bool) -> frozenset[str]:
        """Who takes part in round `round_number`.

        Collaborators with a live task stream, at least the quorum of them (`quorum.participants`; the first
        round of a process waits for everyone it can). A public seam: an override may leave collaborators out of
        what this returns (an aggregator that singles a site out), never add one without a task stream.
        """
        return participants(
            self.network.board,
            self.plan.quorum,
            frozenset(self.plan.collaborators),
            self.excluded,
            round_number,
            wait_for_everyone=wait_for_everyone,
            startup_timeout=self.startup_timeout,
            checkpoint_round=self._saved_round,
            output=self.output,
            events=self.events,
            auditor=self.plan.secure_aggregation.auditor if round_number > STATISTICS_ROUND else None,
        )

    def _saved_round(self) -> int | None:
        """The round of the checkpoint kept in the output folder, None when there is none."""
        return self.checkpoint.round if (self.output / CHECKPOINT_NAME).exists() else None

    def _exclude(self, round_number: int, culprits: dict[str, str], record: dict[str, Any]) -> None:
        """Leave the round's culprits out of every later round; say so in the log and in `record`."""
        new = {name: why for name, why in culprits.items() if name not in self.excluded}
        for name, why in new.items():
            logger.error(
                "round %d: %s misbehaved in secure aggregation (%s); it is excluded from the rest of the "
                "federation, across restarts too; once the institutions have settled it, restart the "
                "aggregator with --resume --readmit %s to let it back in",
                round_number,
                name,
                why,
                name,
            )
        if new:
            self.excluded.update(new)
            record["excluded"] = new
            for name, why in new.items():
                self.events.emit("exclusion", round=round_number, name=name, reason=why)

    def train(self, round_number: int, *, wait_for_everyone: bool = False) -> dict[str, Any]:
        """One training round; the model changes only if the round completes and passes the checks."""
        connected = self.choose_participants(round_number, wait_for_everyone=wait_for_everyone)
        state = self.checkpoint.state
        started, started_cpu = time.perf_counter(), time.process_time()
        record: dict[str, Any] = {
            "round": round_number,
            "participants": sorted(connected),
            "model_sha256": state_digest(state),
            "secure_aggregation": self.plan.secure_aggregation.enabled,
        }
        # With drift correction the server's control variate sigma travels with (theta, c), and every
        # collaborator's sigma_k+ comes back inside the same summed vector (2 (d + 1) long).
        corrects_drift, size = holding(state).has("control"), parameters(state)
        fraction = self.plan.batch_fraction
        dimension, plan = update_dimension(size, corrects_drift), self.plan
        encoding = plan.training_encoding(plan.federation_id, len(plan.collaborators), round_number, dimension)
        try:
            try:
                # After a round voided once its sum was unmasked, only its survivors can train on this model again.
                participants = self.bound.participants(
                    self.network.board, round_number, connected, plan.quorum.round_timeout_seconds, self.events
                )
            finally:
                # Opened after that wait: a survivor whose stream opens during it is sent this round's tasks.
                self.network.board.new_round(round_number)
            record["participants"] = sorted(participants)
            outcome = self.driver.run(
                round_number,
                training_stages(self.plan.secure_aggregation),
                participants,
                encoding.noise.encoded_dimension if encoding.noise is not None else dimension,  # rotated: padded
                encoding,
                # Built in the call, never a local of this frame: the driver drops it once the board's parts are cut.
                (training_values(state, self.plan.model.factory is None), holding(state).c),
                start_input=self.start_input,
                screen=screen_plain_update(self.plan.influence, fraction, size),
            )
            clip = self.encoding.clip if self.plan.secure_aggregation.enabled else None
            check_decoded_update(outcome, clip, len(outcome.contributors))
            # The server divides by the weight the plan agrees for the contributors, never by a claimed one.
            agreed = check_agreed_influence(outcome, self.plan.influence, fraction, size)
            # The round's state is given up (self.checkpoint is replaced with the new one below): the step is
            # formed in its tensors, so the aggregator never holds the old and the new model side by side.
            state = step(state, outcome.weighted_sum, agreed, self.algorithm, self.average_from, self.output)
        except (RoundAbortedError, AggregateError) as error:
            record.update(status="aborted", reason=str(error), seconds=time.perf_counter() - started)
            self.network.board.past_rounds.ended(round_number, False, (), ())
            extra = per_round(round_number, self.plan.training.rounds)
            logger.warning("round %d aborted, model unchanged: %s", round_number, error, extra=extra)
            if isinstance(error, RoundAbortedError):
                self._exclude(round_number, error.culprits, record)
            self._set_aside_silent(round_number)
            # Noised inputs are each one round's (the sites train afresh on the same model): nothing to bind.
            if self.driver.bound_inputs and not self.plan.privacy.distributed:
                self.bound.note(round_number, self.driver.bound_inputs, str(error))
                self.driver.bound_inputs = frozenset()
            return record
        self._exclude(round_number, outcome.culprits, record)
        self.bound.clear()
        # Before any later stage is opened: a site that missed this round may ask for it from the next one on.
        self.network.board.past_rounds.ended(round_number, True, outcome.verified_by, self.plan.collaborators)
        self.checkpoint = dataclasses.replace(self.checkpoint, state=state, evaluation=self.evaluation)
        record.update(
            status="applied",
            contributors=list(outcome.contributors),
            dropped=outcome.dropped,
            total_weight=outcome.total_weight,
            mean_update_error_bound=outcome.error_bound * (1.0 + self.encoding.clip) / outcome.total_weight,
            mean_update_noise_std=outcome.noise_std / outcome.total_weight,
            c=state.c,
            c_average=state.c_average,
            received_bytes=outcome.received_bytes,
            stage_seconds=outcome.stage_seconds,
            seconds=time.perf_counter() - started,
            # The aggregator process's CPU for the round (every thread of it: gRPC's, the driver's).
            cpu_seconds=time.process_time() - started_cpu,
        )
        if outcome.verdict_record_sha256:  # what a liar named in `excluded` was proven by, as each site received it
            record["verdict_record_sha256"] = outcome.verdict_record_sha256
        logger.info(
            "round %d applied: %d of %d participants contributed, total weight %.6g, c = %.5f (%.2f s)",
            round_number,
            len(outcome.contributors),
            len(participants),
            outcome.total_weight,
            state.c,
            record["seconds"],
            extra=per_round(round_number, self.plan.training.rounds),
        )
        return record

    def _set_aside_silent(self, round_number: int) -> None:
        """After an aborted round, count the sites it waited for in vain, their streams still open, as absent.

        A frozen or hung process keeps its connection: taken into the next round, it would abort that one too at
        its timeout, so one outage would cost two rounds. Absent, it is waited for as the quorum is (up to the round
        timeout), and is back as soon as it makes a call (:meth:`Board.unanswered <.board.Board.unanswered>`).
        """
        if self.driver.grace.round != round_number:
            return  # it aborted before its sum began (a voided round's survivors missing): nobody was waited for
        never = {
            peer for answers in self.driver.answers.values() for peer, seconds in answers.items() if seconds is None
        }
        silent = self.network.board.unanswered(never)
        if silent:
            logger.warning(
                "round %d: %s never answered it though %s task stream is still open (a frozen, hung or swamped "
                "process); counted absent from the next rounds until heard from again",
                round_number,
                ", ".join(sorted(silent)),
                "its" if len(silent) == 1 else "their",
            )

    def evaluate(self, round_number: int) -> dict[str, Any]:
        """Federated worst / best / mean test risk of the output model (theta-bar, c-bar), from secure sums.

        At the final round it adds the worst group's composition when the plan names columns. Never
        raises for a failed evaluation: returns ``{"status": "skipped" | "aborted", "reason": ...}``.
        """
        board, state = self.network.board, self.checkpoint.state
        participants = board.connected() - self.excluded.keys()
        needed = max(self.plan.quorum.min_collaborators, 2 if self.plan.secure_aggregation.enabled else 1)
        if len(participants) < needed:
            logger.warning(
                "round %d: evaluation skipped, only %d collaborators connected", round_number, len(participants)
            )
            return {"status": "skipped", "reason": "too few collaborators connected"}
        model = (output_values(state, self.plan.model.factory is None), holding(state).c_average)
        digest = model_digest(*model)
        earlier = self.asked if self.asked is not None and self.asked.model == digest else None
        self.asked = earlier or Earlier(digest, round_number, None)
        try:
            classes = model_settings(self.plan, checkpoint_encoder(self.checkpoint)).classes
            outcome, result = federated_evaluation(
                self.plan, self.driver, round_number, participants, model, self.start_input, classes, earlier
            )
            if earlier is None:  # the sites that answered a model's first ask hold its answer for good
                self.asked = Earlier(digest, round_number, frozenset(outcome.contributors))
        except (RoundAbortedError, ConfigError) as error:
            logger.warning("round %d: evaluation aborted: %s", round_number, error)
            aborted: dict[str, Any] = {"status": "aborted", "reason": str(error)}
            if isinstance(error, RoundAbortedError):
                self._exclude(round_number, error.culprits, aborted)
            return aborted
        self._exclude(round_number, outcome.culprits, result)
        self.evaluation = result
        return result
