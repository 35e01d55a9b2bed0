"""The board: the only state the aggregator's gRPC threads and its round driver share.

Behind one condition variable it holds who has a live task stream, each peer's tasks
for the current round, the models to download, and the one open stage (who is
expected to upload, what each may fetch, and the handler that checks and absorbs an
upload). The driver opens a stage and waits on the condition until the stage is
settled (:mod:`fedfair.runtime.aggregator.stages` says when) or its deadline passes;
servicer threads notify it. Nothing sleeps for a fixed time.

Why: docs/design.md, "Inside the aggregator".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial


from fedfair.core.errors import Refusal, RefusedError
from fedfair.runtime.aggregator.offers import Offers, Position, position
from fedfair.runtime.aggregator.past_rounds import PastRounds
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.aggregator.stages import OpenStage, StageProgress, StageReady, StageTiming, UploadHandler
from fedfair.runtime.aggregator.stages import error_summary, input_for
from fedfair.runtime.aggregator.starts import Starts
from fedfair.runtime.transport import NOT_EXPECTED, Pieces, WireStage, pb, task_with_input

TASK_WAIT_SECONDS = 30.0
"""A task stream re-checks that its RPC is alive at least this often; an ended RPC normally
wakes it at once through the RPC's termination callback (which notifies the board)."""

FINAL_FETCH_SECONDS = 60.0
"""How long a stream that delivered FINISHED with a bundle stays open for its peer to fetch it."""

PROGRESS_SECONDS = 10.0
"""How often a stage that is still waiting reports its progress to the operator."""


@dataclass(frozen=True)
class StreamStart:
    """Where one task stream begins.

    The round it sits out (if it joined mid-round) and the latest (round, stage) of this process it may skip
    (None: it may skip nothing).
    """

    stale_round: int | None
    seen: Position | None


class Board:
    """Shared state of one aggregator: connections, tasks, models and the open stage."""

    def __init__(
        self, plan_digest: str, *, clock: Callable[[], float] = time.monotonic, events: EventLog | None = None
    ) -> None:
        self.plan_digest = plan_digest
        self.events = events
        """Where the round's waits are written for the operator's views (None: nowhere)."""
        self.manifest_digest = ""
        """The manifest the current round runs under, named in its tasks (set at the round's start)."""
        self._clock = clock
        lock = threading.RLock()
        # The driver's condition: connections, departures and the open stage's answers.
        self._changed = threading.Condition(lock)
        # The task streams' condition: published tasks, a new round, the end, a stream that ended.
        self._tasks_changed = threading.Condition(lock)
        self._streams: dict[str, int] = {}
        self._tasks: dict[str, list[pb.Task]] = {}
        self._generation = 0
        self._final: pb.Task | None = None
        self._closed = False
        self.offers = Offers()
        """What the round's start stage offers for download: its model and input (it has no open stage)."""
        self.past_rounds = PastRounds(None)
        """The public inputs of the last applied training rounds, for a site that missed one (none kept: set by
        :func:`~fedfair.runtime.aggregator.network.serve` to the output folder's)."""
        # What the FINISHED task offers every peer to fetch (the final model bundle).
        self._final_input = b""
        self._stage: OpenStage | None = None
        self._round = 0
        self._departed: set[str] = set()
        # Collaborators gone this round whose new task stream took up a rejoinable stage of it: peer -> that stage.
        self._rejoined: dict[str, WireStage] = {}
        # Peers an aborted round waited for in vain while their streams stayed open (frozen or hung processes):
        # absent from the quorum until they are heard from again.
        self._unanswered: set[str] = set()
        self._uploading: dict[str, int] = {}
        # The latest task this board (this process) sent each peer: what a reconnecting stream may skip.
        self._delivered: dict[str, Position] = {}
        self._epsilons: dict[str, float] = {}
        self.verifiers: frozenset[str] = frozenset()
        """Peers that follow the task stream but are never collaborators (the plan's auditor): uploads at a stage
        that expects one are waited for, but none counts as connected toward a round's quorum or roster."""
        self.starts = Starts(time.monotonic)  # on the quorum wait's clock, whatever `clock` the stages use
        """Who is starting (its task stream ended, or it fetched the plan without one), and how long starts take."""

    # ------------------------------------------------------------ connections

    def connect(self, peer: str, after: pb.Binding) -> StreamStart:
        """Count a new task stream of `peer` that last handled `after`; where that stream begins.

        The start is fixed here, under the same lock that makes the peer count as connected:
        the driver may begin a round the moment it sees the peer (the quorum it waited for),
        and a stream that judged the round later would sit out a round it is a participant of.
        """
        with self._changed:
            self._streams[peer] = self._streams.get(peer, 0) + 1
            self._unanswered.discard(peer)
            # Opened with `after` before the round in progress: a process that restarted or joined late has none of
            # this round's state, so it starts with the next round, but for a rejoinable stage (:meth:`_takes_up`).
            stale_round = self._round if after.round < self._round else None
            delivered = self._delivered.get(peer)
            seen = None if delivered is None else min(position(after), delivered)
            self.starts.streaming(peer)
            self._changed.notify_all()
            return StreamStart(stale_round, seen)

    def disconnect(self, peer: str) -> bool:
        """Count a task stream of `peer` as ended; return whether it was the peer's last (it left)."""
        with self._changed:
            left = self._streams.get(peer, 0) - 1
            if left > 0:
                self._streams[peer] = left
            else:
                self._streams.pop(peer, None)
                # Gone for the rest of this round, even if it reconnects: a restarted process has
                # lost its round state, so no stage of this round should wait for it.
                self._departed.add(peer)
                self.starts.left(peer)
            self._changed.notify_all()
            self._tasks_changed.notify_all()
            return left <= 0

    def connected(self) -> frozenset[str]:
        """Collaborators with at least one live task stream (never a :attr:`verifiers` peer), but :meth:`unanswered`."""
        with self._changed:
            return self._present()

    def _present(self) -> frozenset[str]:
        """(Lock held.) What :meth:`connected` returns."""
        return frozenset(self._streams) - self.verifiers - self._unanswered

    def unanswered(self, peers: Iterable[str]) -> frozenset[str]:
        """Count `peers`, which an aborted round waited for in vain, as absent until they are heard from again.

        Only those whose task stream is still open, and has been since the round began: a frozen or hung process
        keeps its connection, and would be taken into the next round, which would abort again at its timeout.
        Any call of theirs (:meth:`heard`) or a new task stream brings them back. Returns who is counted absent.
        """
        with self._changed:
            silent = (frozenset(peers) & self._streams.keys()) - self._departed
            self._unanswered |= silent
            return silent

    def heard(self, peer: str) -> None:
        """`peer` made a call: it is not (or no longer) :meth:`unanswered`."""
        with self._changed:
            if peer in self._unanswered:
                self._unanswered.discard(peer)
                self._changed.notify_all()

    def following(self) -> frozenset[str]:
        """Every peer with a live task stream, :attr:`verifiers` included."""
        with self._changed:
            return frozenset(self._streams)

    def wait_for_connected(self, count: int, timeout: float, among: Iterable[str] | None = None) -> frozenset[str]:
        """Wait until at least `count` peers (of `among`, if given) are connected or `timeout` passes.

        Return who of them is.
        """
        eligible = None if among is None else frozenset(among)

        def present() -> frozenset[str]:
            streaming = self._present()
            return streaming if eligible is None else eligible & streaming

        with self._changed:
            self._changed.wait_for(lambda: self._closed or len(present()) >= count, timeout=timeout)
            return present()

    def wait_for_follower(self, peer: str, timeout: float) -> bool:
        """Wait until `peer` (a :attr:`verifiers` peer too) holds a task stream, the board closes or `timeout` passes."""
        with self._changed:
            return self._changed.wait_for(lambda: self._closed or peer in self._streams, timeout=timeout)

    def wait_until_alone(self, timeout: float) -> None:
        """Wait until no task stream is open (or `timeout` passes)."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed or not self._streams, timeout=timeout)

    # ------------------------------------------------------------ tasks

    @property
    def round(self) -> int:
        """The round in progress (0 before the first)."""
        with self._changed:
            return self._round

    def record_epsilon(self, peer: str, epsilon: float) -> None:
        """Keep the epsilon `peer` reported spending (the latest report wins), for the round events."""
        with self._changed:
            self._epsilons[peer] = epsilon

    def epsilons(self) -> dict[str, float]:
        """The epsilon each reporting peer last said it has spent."""
        with self._changed:
            return dict(self._epsilons)

    def new_round(self, round_number: int) -> None:
        """Forget the previous round's tasks and models: streams send only the current round's."""
        with self._changed:
            self._round = round_number
            self._tasks = {}
            self.offers.clear()
            self._departed = set()
            self._rejoined = {}
            self._generation += 1
            self._tasks_changed.notify_all()

    def publish(
        self,
        peers: Iterable[str],
        binding: pb.Binding,
        action: pb.Action,
        *,
        deadline_seconds: float = 0.0,
        inputs: Mapping[str, bytes | Pieces] | None = None,
    ) -> None:
        """Queue one task per peer, with its input (see :func:`task_with_input`)."""
        with self._changed:
            for peer in peers:
                task = self._task(binding, action, deadline_seconds)
                payload = b"" if inputs is None else inputs.get(peer, b"")
                self._tasks.setdefault(peer, []).append(task_with_input(task, payload))
            self._tasks_changed.notify_all()

    def _task(self, binding: pb.Binding, action: pb.Action, deadline_seconds: float = 0.0) -> pb.Task:
        return pb.Task(
            binding=binding,
            action=action,
            deadline_seconds=deadline_seconds,
            plan_digest=self.plan_digest,
            manifest_digest=self.manifest_digest,
        )

    def finish(self, binding: pb.Binding, payload: bytes = b"") -> None:
        """Tell every stream, now and later, that the federation is over.

        Every peer that reads the FINISHED task is offered `payload` (the final model bundle).
        """
        with self._changed:
            self._final_input = payload
            self._final = task_with_input(self._task(binding, pb.ACTION_FINISHED), payload)
            self._tasks_changed.notify_all()

    def wake_streams(self) -> None:
        """Make every task stream re-check that it may go on (a roster update revoked some certificates)."""
        with self._changed:
            self._tasks_changed.notify_all()

    def close(self) -> None:
        """The server is stopping: wake every waiter so threads can end."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            self._tasks_changed.notify_all()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the server is stopping)."""
        with self._changed:
            return self._closed

    def stream_tasks(self, peer: str, start: StreamStart, is_active: Callable[[], bool]) -> Iterator[pb.Task]:
        """The peer's tasks of the current round that it has not seen, as they are published.

        `start` is what :meth:`connect` fixed for this stream. Tasks up to the last one the
        peer handled are skipped only if this board delivered them to the peer: a task
        seen from an earlier aggregator process (killed, then resumed) does not hide the
        round it re-runs. A stream opened before the round then in progress (a
        collaborator process that restarted, or joined late) sits that round out and
        starts with the next one, but for the task of a rejoinable stage open for it and the rest of that
        aggregation (:meth:`_takes_up`). The stream ends when `is_active()` turns false; the
        RPC's termination callback notifies the board (e.g. through :meth:`disconnect`)
        so that happens at once.
        """
        stale_round, seen = start.stale_round, start.seen
        generation, sent = -1, 0
        while True:
            with self._changed:
                if generation != self._generation:
                    generation, sent = self._generation, 0
                self._tasks_changed.wait_for(
                    partial(self._stream_should_wake, peer, generation, sent, is_active), timeout=TASK_WAIT_SECONDS
                )
                if self._closed or not is_active():
                    return
                pending = self._tasks.get(peer, [])[sent:] if generation == self._generation else []
                final = self._final
            for task in pending:
                sent += 1
                at = position(task.binding)
                if (seen is None or at > seen) and (
                    task.binding.round != stale_round or self._takes_up(peer, task.binding, is_active)
                ):
                    self._record_delivery(peer, at)
                    yield task
            if final is not None and not pending:
                yield final
                if final.input_size:
                    # Its peer takes the final bundle next (fetching it unless the task carries it): the
                    # stream stays open until the peer hangs up, so an aggregator waiting for its
                    # collaborators to leave serves that fetch.
                    with self._tasks_changed:
                        self._tasks_changed.wait_for(
                            lambda: self._closed or not is_active(), timeout=FINAL_FETCH_SECONDS
                        )
                return

    def _record_delivery(self, peer: str, position: Position) -> None:
        with self._changed:
            self._delivered[peer] = max(position, self._delivered.get(peer, position))

    def _stream_should_wake(self, peer: str, generation: int, sent: int, is_active: Callable[[], bool]) -> bool:
        """Whether a stream that has sent `sent` tasks of `generation` has something new or has ended (lock held)."""
        return (
            self._closed
            or self._final is not None
            or generation != self._generation
            or len(self._tasks.get(peer, ())) > sent
            or not is_active()
        )

    # ------------------------------------------------------------ models and stages

    def open_stage(
        self,
        binding: pb.Binding,
        expected: Iterable[str],
        inputs: bytes | Mapping[str, bytes | Pieces],
        handler: UploadHandler,
        *,
        max_upload_bytes: int,
        timeout: float,
        ready: StageReady | None = None,
        timing: StageTiming | None = None,
        rejoinable: bool = False,
    ) -> None:
        """Open a stage for `expected` peers and send each its task.

        With `rejoinable` (its kind's :attr:`~fedfair.secagg.round.StageSpec.rejoinable`), a collaborator of
        `expected` whose task stream ended is waited for until the deadline, and a new stream of it is handed the
        stage's task while the stage is open (:meth:`stream_tasks`).

        `timing` (given, or made) records when each answers, and its grace may end the stage before `timeout`
        (:class:`StageTiming`).

        `ready` (if given) lets the stage settle as soon as it returns true, without
        waiting for the peers that have not answered (e.g. the secure-aggregation
        server already holds enough unmasking shares). It is called by
        :meth:`wait_stage`, under the board's lock, whenever the board changes
        (after each delivery) and when the wait starts; it must not block.
        """
        peers = frozenset(expected)
        timing = timing or StageTiming(len(peers))
        with self._changed:
            timing.opened = self._clock()
            self._stage = OpenStage(
                binding, peers, inputs, handler, max_upload_bytes, timing.opened + timeout, ready, timing, rejoinable
            )
        per_peer = {peer: input_for(inputs, peer) for peer in peers}
        self.publish(sorted(peers), binding, pb.ACTION_RUN, deadline_seconds=timeout, inputs=per_peer)

    def max_upload_bytes(self) -> int:
        """The open stage's upload limit in bytes; 0 when no stage is open (every upload is refused)."""
        with self._changed:
            return self._stage.max_upload_bytes if self._stage is not None else 0

    def fetch(self, peer: str, binding: pb.Binding) -> bytes | Pieces | None:
        """What `peer` may fetch for the open stage `binding` (None: nothing for it)."""
        with self._changed:
            stage = self._stage
            if stage is not None and stage.binding == binding and peer in stage.expected:
                return input_for(stage.inputs, peer)
        return self.offers.start_input(peer, binding)

    def final_input(self, binding: pb.Binding) -> bytes | None:
        """What the FINISHED task `binding` offers for fetching (None: no such task, or nothing offered)."""
        with self._changed:
            final = self._final
            if final is None or final.binding != binding or not self._final_input:
                return None
            return self._final_input

    @contextmanager
    def uploading(self, peer: str) -> Iterator[None]:
        """Mark an upload by `peer` as in progress for its duration.

        A peer whose earlier upload was refused is still waited for while it has one in
        progress: that upload may be its corrected retry.
        """
        with self._changed:
            self._uploading[peer] = self._uploading.get(peer, 0) + 1
        try:
            yield
        finally:
            with self._changed:
                left = self._uploading[peer] - 1
                if left:
                    self._uploading[peer] = left
                else:
                    del self._uploading[peer]
                self._changed.notify_all()

    def deliver(self, peer: str, binding: pb.Binding, payload: bytes) -> None:
        """Hand an admitted upload to the open stage's handler (empty: the peer withdraws).

        Raises RefusedError: NOT_EXPECTED if the stage is not open for `peer`, INVALID_UPLOAD (with
        the handler's error as its cause) if the handler raised anything: the refusal is
        then `peer`'s answer to the stage unless it tries again (see the module's notes).
        """
        with self._changed:
            stage = self._stage
            if stage is None or stage.binding != binding or peer not in stage.expected:
                raise RefusedError(Refusal.NOT_EXPECTED, NOT_EXPECTED)
            try:
                if payload:
                    stage.handler(peer, payload)
                    stage.accepted.add(peer)
                    stage.received_bytes += len(payload)
                else:
                    stage.withdrawn.add(peer)
            except Exception as error:  # any exception: key and certificate parsers raise ValueError and worse
                stage.refused.add(peer)
                if isinstance(error, RefusedError) and error.reason is Refusal.INVALID_UPLOAD:
                    raise
                raise RefusedError(Refusal.INVALID_UPLOAD, error_summary(error)) from error
            finally:
                stage.timing.answered(peer, self._clock())
                self._changed.notify_all()

    def wait_stage(
        self, progress: Callable[[StageProgress], None] | None = None, every: float = PROGRESS_SECONDS
    ) -> None:
        """Wait until the open stage is settled (see the module's notes) or its deadline passed.

        While it waits, `progress` (if given) is called every `every` seconds, outside the
        board's lock, with who has answered and who is still awaited; after such a call, once more when the
        wait ends, with nobody awaited (the wait it reported is over).
        """
        with self._changed:
            stage = self._stage
        if stage is None:
            return

        def owed() -> list[str]:
            # Lock held. The peers still owed an answer that can still give one.
            pending = stage.expected - stage.accepted - stage.withdrawn
            return sorted(
                peer
                for peer in pending
                if self._may_answer(stage, peer) and (peer not in stage.refused or peer in self._uploading)
            )

        def settled() -> bool:
            return self._closed or (stage.ready is not None and stage.ready()) or not owed()

        next_report, reported = self._clock() + every, False
        while True:
            with self._changed:
                remaining = stage.deadline - self._clock()
                if settled() or remaining <= 0:
                    over = StageProgress(stage.binding, len(stage.accepted), len(stage.expected), (), 0.0)
                    break
                self._changed.wait(timeout=min(remaining, max(next_report - self._clock(), 0.0)))
                now = self._clock()
                if settled() or now >= stage.deadline or now < next_report:
                    continue
                snapshot = StageProgress(
                    stage.binding, len(stage.accepted), len(stage.expected), tuple(owed()), stage.deadline - now
                )
            next_report = now + every
            if progress is not None:
                progress(snapshot)
                reported = True
        if reported and progress is not None:
            progress(over)

    def _may_answer(self, stage: OpenStage, peer: str) -> bool:
        """(Lock held.) Whether `peer` can still answer `stage`: it follows the round, or may come back to this stage.

        A peer gone for the rest of the round (:meth:`disconnect`) cannot, but a collaborator at a rejoinable stage
        can, and at the later stages of that aggregation once its new stream took it up. At a rejoinable stage some
        live or future stream of an expected collaborator that has not answered can always answer for it, so it is
        waited for to the deadline: its live stream answers, or, once that stream ended, its next stream is handed
        the stage (:meth:`_takes_up`, which hands it to every such stream, not only to the first).
        """
        if stage.rejoinable and peer not in self.verifiers:
            return True
        if peer not in self._streams:
            return False
        return peer not in self._departed or self._took_up_before(peer, WireStage.of(stage.binding))

    def _took_up_before(self, peer: str, at: WireStage) -> bool:
        """(Lock held.) Whether a new stream of `peer` took up a rejoinable stage of `at`'s aggregation before `at`."""
        rejoined = self._rejoined.get(peer)
        return rejoined is not None and rejoined.aggregation == at.aggregation and rejoined.step < at.step

    def _takes_up(self, peer: str, binding: pb.Binding, is_active: Callable[[], bool]) -> bool:
        """Whether a stream of `peer` opened before this round began is handed the task `binding` of this round.

        The task of a rejoinable stage that is open and expects `peer`, a collaborator that has not answered it (a
        process restarted since its contribution, which kept on disk what the stage needs); then, once its stream
        took it up, the later stages of that aggregation (its abort included, which is bound to its last). Never a
        task of a stage that closed before the stream took it up, nor of the round's other aggregations.

        Every such stream is handed the open stage, the latest too: a process that took it up and died before its
        answer left leaves the stage owed, and its next process answers it (:meth:`_may_answer` waits for it). But
        only once the peer's earlier streams ended: a stream opened beside a live one (a second process of the
        site, or a restart whose old connection is not yet seen to end) waits here until the others end, the stage
        is answered or closed, the federation finishes or the stream itself ends, so one process answers at a time.
        """
        at = WireStage.of(binding)
        with self._changed:
            if self._took_up_before(peer, at):
                return True
            while (
                self._open_for(peer, binding)
                and self._streams.get(peer, 0) > 1
                and is_active()
                and not self._closed
                and self._final is None
            ):
                self._tasks_changed.wait(timeout=TASK_WAIT_SECONDS)
            if not is_active() or self._streams.get(peer, 0) > 1 or not self._open_for(peer, binding):
                return False
            self._rejoined[peer] = at
            self._changed.notify_all()
            return True

    def _open_for(self, peer: str, binding: pb.Binding) -> bool:
        """(Lock held.) Whether `binding` is the open rejoinable stage and `peer` a collaborator that still owes it."""
        stage = self._stage
        return (
            stage is not None
            and stage.rejoinable
            and stage.binding == binding
            and peer not in self.verifiers
            and peer in stage.expected - stage.accepted - stage.withdrawn
        )

    def close_stage(self) -> tuple[frozenset[str], int]:
        """Close the open stage; return who uploaded to it and how many bytes arrived."""
        with self._changed:
            stage, self._stage = self._stage, None
            if stage is None:
                return frozenset(), 0
            stage.timing.closed = self._clock()
            return frozenset(stage.accepted), stage.received_bytes
