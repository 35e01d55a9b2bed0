"""Starting the aggregator process: what must hold before serving, then serve and run the rounds."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError, FedfairError
from fedfair.fairness import sums
from fedfair.runtime.output_folder import ROUND_LOG_NAME
from fedfair.runtime.aggregator.checkpoint import Checkpoint, load_checkpoint, trim_round_log
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.aggregator.lock import output_lock
from fedfair.runtime.observe.federation_metrics import start_monitoring
from fedfair.runtime.output_folder import BUNDLE_NAME, CHECKPOINT_NAME
from fedfair.runtime.memory import share_arenas
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.aggregator.network import Network, serve
from fedfair.runtime.observe.logs import CLOSING_LINE
from fedfair.runtime.failures import finished_exit
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, plan_content, plan_digest
from fedfair.runtime.preprocessing import statistics_encoding
from fedfair.runtime.report.page import refresh_report
from fedfair.runtime.report.verdicts import progress_note
from fedfair.runtime.state_files import holding
from fedfair.runtime.stops import stop_name, stop_status
from fedfair.secagg import check_no_wraparound

logger = logging.getLogger("fedfair.aggregator")

GOODBYE_SECONDS = 10.0
"""How long the aggregator waits at least for collaborators to read FINISHED before it stops serving."""

BUNDLE_FETCH_BYTES_PER_SECOND = 20e6
"""The slowest rate, all collaborators' fetches together, that the goodbye allows for the final bundle.

Each collaborator fetches the bundle inside its FINISHED task, so the goodbye must outlast the fetches: at
d = 10^8 three sites fetch 1.2 GB, which a fixed 10 s cut off on this project's 2-core machine (the aggregator
stopped serving mid-fetch, and a site kept no bundle). 20 MB/s is well under what loopback or a LAN sustains.
"""


def goodbye_seconds(bundle_bytes: int, collaborators: int) -> float:
    """The longest the aggregator waits for every task stream to close after FINISHED.

    `GOODBYE_SECONDS`, plus every collaborator's fetch of a `bundle_bytes` bundle at
    `BUNDLE_FETCH_BYTES_PER_SECOND`. It ends as soon as the last collaborator hangs up, so a prompt federation
    never waits it out; it bounds the wait on one that has gone silent.
    """
    return GOODBYE_SECONDS + collaborators * bundle_bytes / BUNDLE_FETCH_BYTES_PER_SECOND


def prepare(plan: AggregatorPlan, *, resume: bool) -> Checkpoint | None:
    """Check what must hold before serving.

    Return the state to start from (None: a fresh federation with a [schema], whose initial model needs the
    statistics aggregation first).
    """
    if plan.secure_aggregation.enabled:
        n = len(plan.collaborators)
        # Every kind of sum runs under secure aggregation: the training updates (their encoding checked when
        # the plan was read), the evaluation answers and, under a [schema], the table statistics.
        encodings = [sums.ENCODING]
        if plan.schema is not None:
            encodings.append(statistics_encoding(plan.privacy.noised))
        for encoding in encodings:
            check_no_wraparound(encoding.clip, encoding.fractional_bits, encoding.modulus_bits, n, encoding.max_weight)
    digest, content = plan_digest(plan), plan_content(plan)
    output = plan.aggregator.output
    if resume:
        # The content goes into every later checkpoint, also of a run begun before it was kept.
        checkpoint = dataclasses.replace(load_checkpoint(output, digest, content), plan=content)
        check_drift_correction(plan, checkpoint, output / CHECKPOINT_NAME)
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
    if plan.schema is not None:
        return None  # the model's size comes from the statistics aggregation (RoundLoop.federate_statistics)
    return Checkpoint(0, initial_state(plan), digest, plan=content)


def check_drift_correction(plan: AggregatorPlan, checkpoint: Checkpoint, path: Path) -> None:
    """Refuse a checkpoint whose state's control variate disagrees with the plan's drift correction.

    The rounds read drift correction from the state (its control variate rides in every download and sum), the plan's
    checks from ``[training] drift_correction``: they must be the same fact, or the round's length is not the one
    the plan was checked at. The plan's digest names the setting, so only a state written otherwise (by hand, or by
    another tool under this plan's digest) differs.

    Raises:
        ConfigError: naming what the state holds, what the plan says, and the fix.
    """
    planned = plan.training.local.drift_correction
    if holding(checkpoint.state).has("control") == plan.training.local.corrects_drift:
        return
    held = "a control variate (drift correction)" if planned == "none" else "no control variate (no drift correction)"
    raise ConfigError(
        f'checkpoint {path} holds {held} but the plan\'s [training] drift_correction = "{planned}"; resume with '
        "the plan the checkpoint was written under, or start afresh in another output folder (--output)"
    )


def serve_again(plan: AggregatorPlan, old: Network, address: str | None, events: EventLog) -> Network:
    """Stop `old` and serve `plan` anew on the same port, with a fresh board and gate.

    As a restarted process would, without leaving the process; collaborators reconnect on their own.
    """
    old.stop()
    host = (address or plan.aggregator.address).rpartition(":")[0]
    return serve(plan, plan_digest(plan), f"{host}:{old.port}", events)


def run_aggregator(
    plan: AggregatorPlan, *, resume: bool = False, address: str | None = None, startup_timeout: float = 0.0
) -> dict[str, Any]:
    """Serve and run a whole federation; return the final summary.

    The output folder's lock (:func:`~fedfair.runtime.aggregator.lock.output_lock`) is
    taken before anything is read or written there, and held until the server has stopped.
    `startup_timeout` bounds the first round's wait for the quorum (0: no deadline).
    """
    share_arenas()  # before the server's threads start (fedfair.runtime.memory)
    with output_lock(plan.aggregator.output):
        checkpoint = prepare(plan, resume=resume)
        events = EventLog(plan.aggregator.output)
        network = serve(plan, plan_digest(plan), address, events)
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
            first_round=1 if checkpoint is None else checkpoint.round + 1,
            rounds=plan.training.rounds,
            collaborators=list(plan.collaborators),
            plan_digest=plan_digest(plan),
            # The two-verifier input bound's auditor (None: no input bound), for the status and the report.
            auditor=plan.secure_aggregation.auditor,
        )
        # Metrics and the status page read the events and round log at each request: nothing to feed them.
        try:
            monitor = (
                None if plan.monitoring is None else start_monitoring(plan.aggregator.output, plan.monitoring, events)
            )
        except BaseException:
            network.stop()
            raise
        try:
            loop = RoundLoop(
                plan,
                network,
                checkpoint,
                events,
                startup_timeout=startup_timeout,
                serve_again=lambda old: serve_again(plan, old, address, events),
            )
        except BaseException:
            network.stop()
            if monitor is not None:
                monitor.stop()
            raise
        del checkpoint  # the loop's now: it lets round 0's model go once round 1 applies
        try:
            summary = loop.run()
            # While collaborators fetch the bundle: the operator's page of the run (never fails the run).
            report = refresh_report(plan.aggregator.output) if plan.aggregator.report else None
            # Give collaborators a bounded moment to read FINISHED, fetch the bundle and hang up.
            bundle = plan.aggregator.output / BUNDLE_NAME
            size = bundle.stat().st_size if bundle.exists() else 0
            loop.network.board.wait_until_alone(goodbye_seconds(size, len(plan.collaborators)))
            if monitor is not None:
                monitor.final_scrape()
        except FedfairError as error:
            # Before the network stops: the streams its stop ends are not the sites' doing (fedfair status).
            events.emit("stop", reason=str(error), status=2)
            raise
        except KeyboardInterrupt as stop:
            events.emit("stop", reason=stopped_line(plan, stop), status=stop_status(stop))
            raise
        finally:
            loop.network.stop()
            if monitor is not None:
                monitor.stop()
    say_finished(plan, summary, report)
    return summary


def stopped_line(plan: AggregatorPlan, stop: KeyboardInterrupt) -> str:
    """The closing line of an aggregator an operator stopped (Ctrl-C, SIGTERM, ``fedfair stop``): how to go on."""
    output = plan.aggregator.output
    if (output / CHECKPOINT_NAME).exists():
        return f"stopped by {stop_name(stop)}; the last checkpoint is in {output} (continue with --resume)"
    return f"stopped by {stop_name(stop)} before the first round was checkpointed; start again without --resume"


def say_finished(plan: AggregatorPlan, summary: dict[str, Any], report: Path | None) -> None:
    """The aggregator's closing line: the rounds applied, the final evaluation, and what it kept where.

    A WARNING when rounds aborted, naming the exit status (:func:`~fedfair.runtime.failures.finished_exit`: 0
    within the plan's [quorum] aborted_rounds_allowed, else 3); the line always comes last on the console.
    """
    rounds = plan.training.rounds
    aborted = int(summary["aborted_rounds"])
    allowed = plan.quorum.aborted_rounds_allowed
    status = (
        f" ([quorum] aborted_rounds_allowed = {allowed}: exit {finished_exit(aborted, allowed)})" if aborted else ""
    )
    evaluation = summary.get("evaluation") or {}
    if evaluation.get("status") == "done":
        result = f"held-out evaluation: {progress_note(evaluation)}"
    else:
        result = "no final evaluation"
    kept = [f"the model bundle {BUNDLE_NAME}", f"the round log {ROUND_LOG_NAME}"]
    if report is not None:
        kept.insert(1, f"the report {report.name}")
    logger.log(
        logging.WARNING if aborted else logging.INFO,
        "finished: %d of %d rounds applied, %d aborted%s; %s; kept in %s: %s",
        rounds - aborted,
        rounds,
        aborted,
        status,
        result,
        plan.aggregator.output,
        ", ".join(kept),
        extra=CLOSING_LINE,
    )
