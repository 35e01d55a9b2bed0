"""The connection to the aggregator: dial, back off after an outage, watch for silence, follow the task stream.

A :class:`Connection` is composed with a :class:`Follower`, the participant it follows the task stream for
(:class:`~fedfair.runtime.collaborator.client.Collaborator`, or the auditor's
:class:`~fedfair.runtime.auditor.process.AuditorProcess`): it dials a new mutual-TLS channel per connection,
waits the back-off of :mod:`fedfair.runtime.peer.retries` between connections, ends a connection the
aggregator left silent (:mod:`fedfair.runtime.peer.watchdog`), and hands each task to the follower's
:meth:`Follower.handle`. What a task computes is the follower's; the connection lends it, while a connection
is open, the executor its round jobs run on (:attr:`Connection.jobs`), the watchdog and the line budget.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, Protocol, TypeVar

import grpc

from fedfair.core.errors import ConfigError, FailureError
from fedfair.pki.roster import settings_digest
from fedfair.runtime.peer.retries import Backoff
from fedfair.runtime.peer.uplink import RPC_SECONDS, federation_stub
from fedfair.runtime.peer.watchdog import Watchdog
from fedfair.runtime.contract import STREAM_ACCEPTED, aggregations
from fedfair.runtime.failures import CONNECTION_LOST, plan_changed, plan_mismatch, wire_version_mismatch
from fedfair.runtime.manifest import Manifest
from fedfair.runtime.manifest_plan import setting_differences
from fedfair.runtime.plan.aggregator_plan import SharedSettings, json_object
from fedfair.runtime.rate_limits import LineBudget, RateLimit
from fedfair.runtime.transport import (
    JOIN,
    WIRE_VERSION,
    TlsFiles,
    WireStage,
    describe_version,
    make_binding,
    pb,
    pb_grpc,
    plan_request,
    refusing_version,
    secure_channel,
)

LINE_BURST = 10
"""Lines of one kind (refusals, malformed messages, failed stages, withdrawals) written at once."""

LINE_SECONDS = 60.0
"""Then one line of that kind per this many seconds; the rest are counted on the next line, or on one line when
the task stream ends: 20,000 tasks refused within a minute add 11 lines, not 20,000."""


def get_plan(stub: pb_grpc.FederationStub, role: str, address: str) -> pb.PlanReply:
    """The aggregator's plan, asked in this release's wire version by a process of `role` dialling `address`.

    An aggregator of another fedfair release refuses the request, or replies in its own version: either way the
    process stops before any round, with both versions and the fix named.

    Raises:
        PermanentFailureError: ``wire-version-mismatch`` for an aggregator of another wire version.
        grpc.RpcError: any other failure of the call, for the caller's back-off to classify.
    """
    ours = describe_version(WIRE_VERSION)
    try:
        reply: pb.PlanReply = stub.GetPlan(plan_request(), timeout=RPC_SECONDS)
    except grpc.RpcError as error:
        refused = error.code() == grpc.StatusCode.FAILED_PRECONDITION
        theirs = refusing_version(error.details()) if refused else None
        if theirs is None:
            raise
        raise wire_version_mismatch(role, address, describe_version(theirs), ours) from None
    if reply.wire_version != WIRE_VERSION:
        raise wire_version_mismatch(role, address, describe_version(reply.wire_version), ours)
    return reply


def plan_change(role: str, manifest: Manifest | None, joined_digest: str, reply: pb.PlanReply) -> FailureError | None:
    """Why a process of `role` ("collaborator", "auditor") joined under `joined_digest` refuses `reply`'s plan, or None.

    Returns a ``plan-changed`` PermanentFailureError whose message names the fields unlike the plan `manifest` pins.

    Raises:
        PermanentFailureError: ``plan-mismatch`` when the served settings are not a JSON object.
    """
    if reply.plan_digest == joined_digest:
        return None
    try:
        served = json_object(reply.settings, "the aggregator's plan")
    except ConfigError as error:
        raise plan_mismatch(role, error) from None
    pin = None if manifest is None else manifest.plan
    if pin is None:
        changes = f"this {role}'s manifest pins no plan, so the fields that changed are not known here"
    else:
        fields = setting_differences(pin.settings, served)
        more = f"; and {len(fields) - 12} more" if len(fields) > 12 else ""
        changes = (
            "pinned -> served: " + "; ".join(fields[:12]) + more
            if fields
            else "the same shared settings: the aggregator's roster or manifest changed"
        )
    return plan_changed(role, settings_digest(served), changes)


class Dialling(Protocol):
    """What a :class:`Connection` dials with: its own name and files, the aggregator's address and name."""

    @property
    def name(self) -> str:
        """This participant's name (its certificate's)."""
        ...

    @property
    def aggregator(self) -> str:
        """The aggregator's address (host:port)."""
        ...

    @property
    def aggregator_name(self) -> str | None:
        """The name the aggregator's certificate must carry (None: the address's host)."""
        ...

    @property
    def certificates(self) -> TlsFiles:
        """This participant's TLS files."""
        ...

    @property
    def idle_timeout_seconds(self) -> float:
        """How long the aggregator may stay silent before this participant gives up on it."""
        ...


Settings = TypeVar("Settings", bound=Dialling)
"""A participant's own settings, which a connection dials with (a collaborator's or the auditor's config)."""


class Follower(Protocol):
    """What a :class:`Connection` follows the task stream for: the participant's public side."""

    @property
    def shared(self) -> SharedSettings:
        """The federation's shared settings; asked only after :meth:`setup`."""
        ...

    @property
    def plan_digest(self) -> str:
        """The digest of the plan the follower joined under; asked only after :meth:`setup`."""
        ...

    def setup(self, stub: pb_grpc.FederationStub) -> None:
        """Fetch and check the plan over the connection's first channel, before any task."""
        ...

    def plan_change(self, reply: pb.PlanReply) -> FailureError | None:
        """Why the follower does not take the plan in `reply`, or None if it is the plan it joined."""
        ...

    def say_joined(self) -> None:
        """Log that the aggregator took the follower's task stream (once)."""
        ...

    def handle(self, stub: pb_grpc.FederationStub, task: pb.Task) -> bool:
        """Carry out one task; False if it does not count as done (the stream resumes before it)."""
        ...

    def finish(self, stub: pb_grpc.FederationStub, task: pb.Task) -> int:
        """At FINISHED: what the follower keeps of the federation; the process's exit status."""
        ...


class Connection(Generic[Settings]):
    """Follow the aggregator's task stream to FINISHED for `follower`, reconnecting after an outage."""

    def __init__(
        self,
        config: Settings,
        backoff: Backoff,
        stop: threading.Event,
        follower: Follower,
        *,
        role: str = "collaborator",
    ) -> None:
        """Nothing is dialled until :meth:`run`; `stop` is the event :meth:`stop` sets (the back-off waits on it).

        `role` is the one the certificate of `config` is issued for (a collaborator's, or "auditor"); its lines log
        as ``fedfair.<role>``.
        """
        self.config = config
        self.role = role
        self.logger = logging.getLogger(f"fedfair.{role}")
        self.backoff = backoff
        self.follower = follower
        self._stop = stop
        self._stream: Any = None
        self.jobs: ThreadPoolExecutor | None = None
        """Runs each round's start-stage job beside the current connection's task stream (None between them)."""
        self._channel: grpc.Channel | None = None
        self.watchdog = Watchdog(config.name, config.aggregator, config.idle_timeout_seconds, self._silenced, role=role)
        self._lines = LineBudget(RateLimit(per_second=1.0 / LINE_SECONDS, burst=LINE_BURST))
        """The budget of the lines an aggregator's tasks make this process write (:meth:`warn`)."""
        self._announced = False
        """Whether the follower said it joined: once, when the aggregator first took this process's task stream."""

    # ------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask `run` to return (from another thread)."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def run(self) -> int:
        """Connect, let the follower set up, and follow the task stream until FINISHED; the exit status."""
        self._say_connecting()
        with self._dial() as channel:
            self.follower.setup(federation_stub(channel))
        return self._follow()

    def _say_connecting(self) -> None:
        """The run's first console line: the address it dials, how long it waits for an answer, how to stop.

        Said before the first dial: a dial to a host that drops packets, or a port nobody serves, may take
        minutes to reach its one-line error ([retry] start_wait_seconds), and meanwhile the operator sees
        what the process waits for and that Ctrl-C ends the wait.
        """
        started, wait = self.backoff.started, self.backoff.policy.start_wait_seconds
        self.logger.info(
            "%s: connecting to the aggregator at %s; waiting up to %.0f s for it to answer (Ctrl-C stops)",
            self.config.name,
            self.config.aggregator,
            wait if started is None else max(wait - (time.monotonic() - started), 0.0),
        )

    def _await_plan(self) -> None:
        """Once joined, wait until the aggregator serves again the plan the follower joined under.

        It checks with :meth:`Follower.plan_change`: one line per attempt, with back-off, for up to [retry]
        max_wait_seconds (the operator may go back to the old plan), then stop with ``plan-changed``. No task
        stream is held meanwhile, so the aggregator does not count this collaborator in a round it would refuse.
        (Before joining, a plan unlike the pinned one is refused at once as ``plan-mismatch``.)
        """
        self.backoff.call("fetching the plan", self._fetch_plan, self.follower.plan_change)

    def _fetch_plan(self) -> pb.PlanReply:
        """The aggregator's plan, over a new channel (a channel to a restarting aggregator reconnects slowly)."""
        with self._dial() as channel:
            return get_plan(federation_stub(channel), self.role, self.config.aggregator)

    def _dial(self) -> grpc.Channel:
        """A new mutual-TLS channel to the aggregator."""
        return secure_channel(
            self.config.aggregator,
            self.config.certificates,
            aggregator_name=self.config.aggregator_name,
            role=self.role,
        )

    def _silenced(self) -> None:
        """The watchdog's expiry: end every RPC of the current connection now (``_follow`` then stops)."""
        channel = self._channel
        if channel is not None:
            channel.close()

    # ------------------------------------------------------------ the task loop

    def _follow(self) -> int:
        """Follow the task stream to FINISHED under the idle watchdog (:mod:`.watchdog`); return the exit status.

        It reconnects after a lost aggregator on this collaborator's back-off policy until an outage outlasts its bound.
        """
        try:
            with self.watchdog.watching():
                return self._follow_watched()
        finally:
            for kind, count in sorted(self._lines.drain().items()):
                self.logger.warning(
                    "%s: %d more %s since the last such line were not logged", self.config.name, count, kind
                )

    def _follow_watched(self) -> int:
        """:meth:`_follow`'s loop.

        The back-off starts again from its first delay only after a connection that received a task and held for
        at least the delay before it: an aggregator that drops every stream at once (or after one task) is
        dialled ever more slowly, never in a tight loop.
        """
        follower = self.follower
        after = make_binding(follower.shared.federation_id, 0, JOIN)
        what = "following the task stream"
        attempt, since = 0, time.monotonic()
        while not self._stop.is_set():
            changed, progressed, opened = False, False, time.monotonic()
            # A new channel for every connection: a channel whose server went away reconnects on
            # gRPC's own back-off, which grows past a minute, so it, not this policy, would decide
            # when a restarted aggregator is found, and could outlast the policy's bound.
            # The round jobs of a connection use its channel, so they end (a job that lost the aggregator
            # fails its RPCs, training runs to its end) before the channel closes, and in the order started.
            with self._dial() as channel, ThreadPoolExecutor(1, f"{self.config.name}-round") as self.jobs:
                self._channel = channel
                stub = federation_stub(channel)
                try:
                    self._stream = stub.WaitForTasks(pb.TaskRequest(after=after))
                    self._accepted(self._stream)
                    for task in self._stream:
                        progressed = True
                        stage = self.stage_name(task.binding)
                        self.watchdog.waiting_for(f"round {task.binding.round} {stage}'s input")
                        if task.plan_digest != follower.plan_digest:
                            changed = True  # left below, once this connection's round jobs have ended
                            break
                        if task.action == pb.ACTION_FINISHED:
                            return follower.finish(stub, task)
                        if follower.handle(stub, task):
                            after = task.binding
                            self.watchdog.progress()
                    failure = FailureError(
                        CONNECTION_LOST, address=self.config.aggregator, reason="the task stream ended"
                    )
                except grpc.RpcError as error:
                    if self._stop.is_set():
                        break
                    if self.watchdog.expired is not None:
                        raise self.watchdog.expired from None
                    failure = self.backoff.classify(error, what)
                finally:
                    self._channel = None
            if changed:
                # The operator changed the plan: wait, without a task stream, for it to come back (or stop
                # with plan-changed), then follow the stream again from where this collaborator was.
                self._await_plan()
                attempt, since = 0, time.monotonic()
                continue
            if self.watchdog.expired is not None:
                raise self.watchdog.expired
            held = time.monotonic() - opened >= self.backoff.policy.delay_bound(attempt)
            if progressed or held:
                since = time.monotonic()  # a new outage begins now
            if progressed and held:
                attempt = 0
            self.backoff.retry(attempt, since, failure, what)
            attempt += 1
        return 0

    def _accepted(self, stream: Any) -> None:
        """Have the follower say that it joined, once, when the aggregator first takes its task stream.

        The aggregator sends :data:`STREAM_ACCEPTED` once the stream is this name's only live one; a
        refused stream (a second process of a connected name) ends without it, and iterating it then
        raises the refusal. Taking the stream is progress: the wait for the first task starts there.
        """
        if self._announced or STREAM_ACCEPTED not in (stream.initial_metadata() or ()):
            return
        self._announced = True
        self.follower.say_joined()
        self.watchdog.progress("the first task")

    def warn_withdrawal(self, name: str, binding: pb.Binding, error: Exception) -> None:
        """Say that party `name` withdraws from `binding`'s round at its stage, and why (a `warn` of its kind)."""
        self.warn(
            "withdrawals",
            "%s: round %d %s: withdrawing from the round: %s",
            name,
            binding.round,
            self.stage_name(binding),
            error,
        )

    def stage_name(self, binding: pb.Binding) -> str:
        """What logs call `binding`'s stage in this federation ('STAGE_MASKED_INPUT'); asked only after setup."""
        return aggregations(self.follower.shared.secure_aggregation).name(WireStage.of(binding))

    def warn(self, kind: str, message: str, *args: object) -> None:
        """Log a WARNING caused by the aggregator's tasks, within the budget of its `kind`.

        LINE_BURST lines of a kind at once, then one per LINE_SECONDS (:class:`LineBudget`): a hostile or broken
        aggregator sends tasks at the speed of its network, and a line each would bury the operator's log. The
        lines skipped are counted on the next one of the kind (and on one line when the task stream ends).
        """
        unlogged = self._lines.admit(kind)
        if unlogged is None:
            return
        note = f" ({unlogged} more {kind} since the last such line were not logged)" if unlogged else ""
        self.logger.warning(message + "%s", *args, note)
