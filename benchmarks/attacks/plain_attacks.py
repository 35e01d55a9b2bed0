"""Transport, identity, plain-mode and denial-of-service attacks, and the fuzz, against one live federation.

The federation (secure aggregation off, so a plain update's values reach the aggregator's
checks): the real aggregator as an OS process, three honest collaborators in threads with
exact fixed updates, and a fourth listed collaborator, the *insider*, whose process is the
hostile client (:class:`~attacks.hostile_client.TaskFollower`). Each training round the
insider runs that round's share of the attacks against the open MASKED_INPUT stage, then
uploads a genuine update (if no attack's upload was taken in its place); one honest
collaborator uploads only after that, so the stage stays open for every attack (the
aggregator settles a stage once nobody is owed an answer, and a refused sender is owed
none). After the run, the round log is replayed from what each
party sent (:func:`~attacks.round_check.check_rounds`): every applied round must be exactly
the honest updates plus what the aggregator acknowledged from the insider, within bounds.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attacks import fuzz
from attacks.federation import (
    FEDERATION_ID,
    HONEST,
    INSIDER,
    STRANGER,
    AggregatorProcess,
    AttackCredentials,
    FixedTrainer,
    HonestCollaborators,
    attack_credentials,
    attack_workspace,
    exact_update,
    load_plan,
    plain_vector,
    plan_sections,
    trainer_factory,
)
from attacks.round_check import RoundCheck, Sent, check_rounds
from attacks.hostile_client import (
    Answer,
    Credentials,
    LatencyProbe,
    RawFederation,
    TaskFollower,
    ask,
    bind,
    fetch,
    garbage_after_handshake,
    get_plan,
    idle_connections,
    join_binding,
    open_channel,
    part,
    parts,
    plain_payload,
    send,
    stub,
    submit,
)
from attacks.report_attacks import ReportAttacks
from attacks.rows import CHECK, Row, RowBook
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.transport import fedfair_pb2 as pb
from fedfair.runtime.transport.chunks import plain_upload_size, read_plain_upload

LATENCY_LIMIT_SECONDS = 1.0
"""An honest GetPlan must be answered within this while a denial-of-service attack runs."""
LEAK_MARKERS = ("Traceback", "Exception", "Error", 'File "', *HONEST, INSIDER, STRANGER)
"""What a refusal's details must never contain: exception text or anyone's name."""
REFUSED_AT_DOOR = ("UNAVAILABLE", "PERMISSION_DENIED")
HELD = HONEST[-1]
"""The honest collaborator whose MASKED_INPUT upload waits until the insider is done with the stage."""
HOLD_SECONDS = 300.0


@dataclass(frozen=True)
class Sizes:
    """How hard the run pushes (the full run, or --quick)."""

    fuzz_messages: int
    fuzz_rounds: int
    starvation_seconds: float
    flood_connections: int
    flood_seconds: float
    streams: int = 50

    @classmethod
    def of(cls, quick: bool, fuzz_messages: int | None) -> Sizes:
        if quick:
            return cls(fuzz_messages or 500, 1, 2.0, 200, 2.0)
        return cls(fuzz_messages or 10_000, 8, 6.0, 1000, 5.0)


def generic(answer: Answer) -> bool:
    """Whether a refusal says nothing about who takes part or what failed inside the aggregator."""
    return not any(marker in answer.details for marker in LEAK_MARKERS)


def refused(answer: Answer, codes: tuple[str, ...]) -> bool:
    """Whether the request was refused with one of `codes` and generic details (a failed TLS handshake's
    details are the client library's own, so they are not checked)."""
    return answer.code in codes and (answer.code == "UNAVAILABLE" or generic(answer))


@dataclass
class StageContext:
    """The stage the insider holds open, as its attacks see it."""

    task: pb.Task
    parameters: dict[str, Any]
    consumed: bool = False
    """Whether an upload to this stage was taken (the insider's slot is used up)."""

    @property
    def binding(self) -> pb.Binding:
        return self.task.binding

    @property
    def round(self) -> int:
        return int(self.task.binding.round)

    @property
    def dimension(self) -> int:
        return int(self.parameters["dimension"])

    @property
    def clip(self) -> float:
        return float(self.parameters["encoding"]["clip"])


Job = Callable[[StageContext], None]


@dataclass
class PlainAttacks:
    """Runs the plain federation and its attacks; fills `book` and returns the fuzz results."""

    root: Path
    book: RowBook
    sizes: Sizes
    seed: int = 0
    insider_uploads: dict[int, bytes | None] = field(default_factory=dict)
    fuzz_rounds: set[int] = field(default_factory=set)
    _parameters: int | None = None
    _done: dict[int, threading.Event] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _jobs: deque[tuple[str, Job]] = field(default_factory=deque)
    _genuine: dict[int, bytes] = field(default_factory=dict)
    _campaign: fuzz.Campaign | None = None

    def run(self) -> dict[str, Any]:
        rounds = 4 + self.sizes.fuzz_rounds + len(VALUE_ATTACKS)
        names = (*HONEST, INSIDER)
        sections = plan_sections(secure=False, rounds=rounds, quorum=len(names), timeout=90.0)
        self.workspace = attack_workspace(self.root, names, sections)
        self.credentials: AttackCredentials = attack_credentials(self.workspace)
        self.address = self.workspace.address
        self._schedule()
        aggregator = AggregatorProcess(self.workspace)
        self.aggregator = aggregator
        honest = HonestCollaborators.start(
            self.workspace, HONEST, lambda name: trainer_factory(name, FixedTrainer), adjust=self._hold
        )
        insider = TaskFollower(self.address, self.credentials.insider, FEDERATION_ID, self._on_task)
        self.insider = insider
        stranger = open_channel(self.address, self.credentials.stranger)
        identities = {INSIDER: RawFederation(insider.channel), STRANGER: RawFederation(stranger)}
        self._campaign = fuzz.Campaign(identities, {INSIDER}, seed=self.seed)
        insider.start()
        try:
            finished = insider.join(timeout=600)
            stuck = honest.join(timeout=60)
            code = aggregator.wait(30)
        finally:
            insider.stop()
            stranger.close()
            honest.stop()
            aggregator.stop()
        self._leftover_jobs()
        check = check_rounds(load_plan(self.workspace), self.workspace, self._sent)
        self._final_rows(check, finished, stuck, code, honest.errors)
        return self._fuzz_summary(check)

    # ------------------------------------------------------------ the insider's task loop

    def _hold(self, name: str, collaborator: Collaborator) -> None:
        """Make one honest collaborator upload its MASKED_INPUT only once the insider is done with the stage.

        The aggregator closes a stage as soon as no listed peer is still owed an answer,
        and a peer whose upload it refused is owed none; holding one honest upload back keeps
        the stage open for all of the insider's attacks (and its genuine upload after them).
        """
        if name != HELD:
            return
        step = collaborator.step

        def held_step(stub: Any, task: pb.Task) -> None:
            if task.binding.stage == pb.STAGE_MASKED_INPUT:
                self._stage_done(int(task.binding.round)).wait(HOLD_SECONDS)
            step(stub, task)

        collaborator.step = held_step  # type: ignore[method-assign]

    def _stage_done(self, round_number: int) -> threading.Event:
        with self._lock:
            return self._done.setdefault(round_number, threading.Event())

    def _on_task(self, follower: TaskFollower, task: pb.Task) -> None:
        stage = task.binding.stage
        if stage == pb.STAGE_MASKED_INPUT:
            self._masked_input(follower, task)
        elif stage == pb.STAGE_EVAL_MASKED_INPUT:
            submit(follower.channel, parts(task.binding, b""))  # the insider sits evaluations out

    def _masked_input(self, follower: TaskFollower, task: pb.Task) -> None:
        try:
            self._attack_stage(follower, task)
        finally:
            self._stage_done(int(task.binding.round)).set()

    def _attack_stage(self, follower: TaskFollower, task: pb.Task) -> None:
        answer = fetch(follower.channel, task.binding)
        if not answer.ok:
            follower.errors.append(
                f"round {task.binding.round}: could not fetch the round parameters: {answer.describe()}"
            )
            return
        context = StageContext(task, json.loads(answer.reply))
        self._parameters = context.dimension - 1
        while self._jobs and not context.consumed:
            name, job = self._jobs[0]
            if name == "fuzz" and context.round in self.fuzz_rounds:
                break  # one fuzz batch per round
            self._jobs.popleft()
            job(context)
        if not context.consumed:
            payload = self._genuine_payload(context)
            answer = submit(follower.channel, parts(context.binding, payload))
            if answer.ok:
                self._genuine[context.round] = payload
                self.insider_uploads[context.round] = payload
            else:
                follower.errors.append(f"round {context.round}: the genuine upload was refused: {answer.describe()}")

    def _genuine_payload(self, context: StageContext) -> bytes:
        return self._genuine_payload_for(context.dimension - 1)

    @staticmethod
    def _genuine_payload_for(parameters: int) -> bytes:
        update = exact_update(INSIDER, parameters)
        return plain_payload(update.weighted_vector().numpy(), update.weight)

    def _upload(self, context: StageContext, messages: list[pb.Part]) -> Answer:
        """Submit as the insider to the open stage, keeping track of whether its slot was used up."""
        answer = submit(self.insider.channel, messages)
        if answer.ok and messages and messages[0].binding == context.binding:
            context.consumed = True
            receipt: pb.Receipt = answer.reply
            payload = b"".join(item.chunk.data for item in messages)
            self.insider_uploads[context.round] = payload if receipt.received_size == len(payload) else None
        return answer

    # ------------------------------------------------------------ the schedule

    def _schedule(self) -> None:
        jobs: list[tuple[str, Job]] = [
            ("identity", self._identity_rows),
            ("malformed", self._malformed_rows),
        ]
        jobs += [(f"value:{name}", self._value_row(name, make)) for name, make in VALUE_ATTACKS.items()]
        jobs += [
            ("slot", self._slot_row),
            ("replay", self._replay_rows),
            ("starvation", self._starvation_row),
            ("flood", self._flood_row),
            ("report", self._report_rows),
        ]
        jobs += [("fuzz", self._fuzz_batch)] * self.sizes.fuzz_rounds
        self._jobs.extend(jobs)

    def _leftover_jobs(self) -> None:
        for name, _ in self._jobs:
            row = self.book.add(Row(f"(scheduled) {name}", "run during a training round", CHECK))
            row.record("never run: the federation ended before this attack's turn", False)

    # ------------------------------------------------------------ who may talk at all

    def _identity_rows(self, context: StageContext) -> None:
        credentials = self.credentials
        cases: list[tuple[str, Credentials, tuple[str, ...], str]] = [
            ("no client certificate", credentials.none, ("UNAVAILABLE",), "the TLS handshake fails"),
            ("certificate from a foreign CA", credentials.foreign_ca, ("UNAVAILABLE",), "the TLS handshake fails"),
            ("expired certificate", credentials.expired, REFUSED_AT_DOOR, "refused at the handshake or the door"),
            (
                "wrong role: a listed name certified as an aggregator",
                credentials.wrong_role,
                REFUSED_AT_DOOR,
                "refused at the handshake or with a generic PERMISSION_DENIED",
            ),
            (
                "wrong role: the aggregator's own certificate as a client",
                credentials.aggregator_as_client,
                REFUSED_AT_DOOR,
                "refused at the handshake or with a generic PERMISSION_DENIED",
            ),
            (
                "unlisted name (valid certificate from the federation's CA)",
                credentials.stranger,
                ("PERMISSION_DENIED",),
                "a generic PERMISSION_DENIED on every RPC, naming nobody",
            ),
        ]
        for attack, presented, codes, expected in cases:
            with self.book.row(attack, expected + "; nothing is accepted") as row:
                answers = self._every_rpc(presented, context)
                bad = {rpc: answer.describe() for rpc, answer in answers.items() if not refused(answer, codes)}
                observed = ", ".join(f"{rpc}: {answer.code}" for rpc, answer in answers.items())
                row.record(observed if not bad else f"not refused as expected: {bad}", not bad)

    def _every_rpc(self, presented: Credentials, context: StageContext) -> dict[str, Answer]:
        channel = open_channel(self.address, presented)
        try:
            federation = stub(channel)
            train = bind(FEDERATION_ID, context.round, pb.STAGE_TRAIN)

            def drain(call: Any) -> int:
                return sum(1 for _ in call)

            return {
                "GetPlan": get_plan(channel, FEDERATION_ID),
                "WaitForTasks": ask(
                    lambda: drain(federation.WaitForTasks(pb.TaskRequest(after=join_binding(FEDERATION_ID)), timeout=3))
                ),
                "DownloadModel": ask(
                    lambda: drain(federation.DownloadModel(pb.FetchRequest(binding=train), timeout=5))
                ),
                "Fetch": fetch(channel, context.binding),
                "Submit": self._foreign_upload(channel, context, "Submit"),
                "Send": self._foreign_upload(channel, context, "Send"),
            }
        finally:
            channel.close()

    def _foreign_upload(self, channel: Any, context: StageContext, rpc: str) -> Answer:
        """The genuine payload uploaded (by ``rpc``: a Submit stream, or a Send of its first part) over
        another identity's channel; if the aggregator takes it, it took it in the insider's slot (the
        certificates of these attacks name the insider)."""
        payload = self._genuine_payload(context)
        messages = parts(context.binding, payload)
        answer = submit(channel, messages) if rpc == "Submit" else send(channel, messages[0])
        if answer.ok:
            context.consumed = True
            self.insider_uploads[context.round] = payload
        return answer

    # ------------------------------------------------------------ malformed uploads

    def _malformed_rows(self, context: StageContext) -> None:
        binding, total = context.binding, plain_upload_size(context.dimension, pb.STAGE_MASKED_INPUT)
        refusals = ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED")
        with self.book.row(
            "random bytes (payload, request body, and raw TLS instead of HTTP/2)",
            "each refused (INVALID_ARGUMENT; the connection closed); the aggregator keeps serving",
        ) as row:
            raw = RawFederation(self.insider.channel)
            rng = np.random.default_rng(self.seed)
            update, body = (
                bytes(rng.integers(0, 256, total, dtype=np.uint8)),
                bytes(rng.integers(0, 256, 999, dtype=np.uint8)),
            )
            answers = {
                "payload of an update's length": self._upload(context, parts(binding, update)),
                "payload of another length": self._upload(context, parts(binding, body)),
                "request body": ask(lambda: raw.get_plan(body, timeout=5)),
            }
            tls = garbage_after_handshake(self.address, self.credentials.insider)
            good = all(refused(answer, refusals) for answer in answers.values()) and tls == "closed"
            alive = self.aggregator.alive
            row.record(
                "; ".join(f"{what}: {answer.describe()}" for what, answer in answers.items())
                + f"; raw TLS garbage: {tls}; aggregator {'alive' if alive else 'DEAD'}",
                good and alive,
            )
        cases: list[tuple[str, str, list[pb.Part], tuple[str, ...]]] = [
            (
                "oversize message (one 2 MiB gRPC message)",
                "RESOURCE_EXHAUSTED before the handler sees it",
                [part(binding, 0, 1, 2 << 20, bytes(2 << 20))],
                ("RESOURCE_EXHAUSTED",),
            ),
            (
                "oversize chunk (just over the chunk limit, under the message limit)",
                "INVALID_ARGUMENT",
                [part(binding, 0, 1, (1 << 20) + 100, bytes((1 << 20) + 100))],
                refusals,
            ),
            (
                "oversize declared payload (64 MiB announced in the first chunk)",
                "INVALID_ARGUMENT before anything is buffered",
                [part(binding, 0, 64, 64 << 20, bytes(1024))],
                refusals,
            ),
            (
                "chunk gaps (chunks 0 and 2 of 3)",
                "INVALID_ARGUMENT",
                [part(binding, 0, 3, 3 * 64, bytes(64)), part(binding, 2, 3, 3 * 64, bytes(64))],
                refusals,
            ),
            (
                "chunk duplicates (chunk 0 twice)",
                "INVALID_ARGUMENT",
                [part(binding, 0, 2, total, bytes(total // 2)), part(binding, 0, 2, total, bytes(total // 2))]
                + [part(binding, 1, 2, total, bytes(total - total // 2))],
                refusals,
            ),
            (
                "chunks that disagree on the payload's size",
                "INVALID_ARGUMENT",
                [part(binding, 0, 2, total, bytes(total // 2)), part(binding, 1, 2, total + 8, bytes(total // 2 + 8))],
                refusals,
            ),
            ("empty Submit stream (no chunk at all)", "INVALID_ARGUMENT", [], refusals),
        ]
        for attack, expected, messages, codes in cases:
            with self.book.row(attack, expected + " with generic details; the slot stays free") as row:
                answer = self._upload(context, messages)
                row.record(answer.describe(), refused(answer, codes))

    # ------------------------------------------------------------ values in a plain update

    def _value_row(self, name: str, make: Callable[[StageContext], bytes]) -> Job:
        def job(context: StageContext) -> None:
            with self.book.row(name, "INVALID_ARGUMENT with generic details; nothing enters the sum") as row:
                answer = self._upload(context, parts(context.binding, make(context)))
                row.record(answer.describe(), refused(answer, ("INVALID_ARGUMENT",)), round=context.round)

        return job

    def _slot_row(self, context: StageContext) -> None:
        """Runs last in its round's stage: the refusals before it must have left the insider's slot free."""
        with self.book.row(
            "refused uploads leave the sender's slot free",
            "after the refused attacks in this stage, the insider's genuine upload is still accepted",
        ) as row:
            payload = self._genuine_payload(context)
            answer = self._upload(context, parts(context.binding, payload))
            if answer.ok:
                self._genuine[context.round] = payload
            row.record(answer.describe(), answer.ok, round=context.round)

    # ------------------------------------------------------------ replays

    def _replay_rows(self, context: StageContext) -> None:
        earlier = max((number for number in self._genuine if number < context.round), default=None)
        payload = self._genuine.get(earlier or -1, self._genuine_payload(context))
        stage = pb.STAGE_MASKED_INPUT
        cases = [
            ("replay: an upload of an earlier round", bind(FEDERATION_ID, earlier or 0, stage)),
            ("replay: a future round", bind(FEDERATION_ID, context.round + 1, stage)),
            ("replay: another federation's id", bind("another-federation", context.round, stage)),
            ("replay: another stage of this round", bind(FEDERATION_ID, context.round, pb.STAGE_TRAIN)),
        ]
        for attack, binding in cases:
            with self.book.row(attack, "FAILED_PRECONDITION with generic details; nothing accepted") as row:
                answer = self._upload(context, parts(binding, payload))
                row.record(answer.describe(), refused(answer, ("FAILED_PRECONDITION",)), replayed_round=earlier)

    # ------------------------------------------------------------ denial of service

    def _starvation_row(self, context: StageContext) -> None:
        count, seconds = self.sizes.streams, self.sizes.starvation_seconds
        with self.book.row(
            f"stream starvation ({count} WaitForTasks opened and cancelled in a loop)",
            f"every honest GetPlan answered within {LATENCY_LIMIT_SECONDS:g} s while it runs",
        ) as row:
            federation = stub(self.insider.channel)
            request = pb.TaskRequest(after=join_binding(FEDERATION_ID))
            codes: Counter[str] = Counter()
            loops = 0
            probe = LatencyProbe(self.address, self.credentials.honest, FEDERATION_ID)
            with probe:
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    calls = [federation.WaitForTasks(request) for _ in range(count)]
                    time.sleep(0.05)
                    for call in calls:
                        if call.done():
                            codes[call.code().name] += 1
                        else:
                            call.cancel()
                            codes["held open, then cancelled"] += 1
                    loops += 1
            summary = probe.summary()
            worst = summary["max_seconds"]
            ok = summary["failed"] == 0 and worst is not None and worst < LATENCY_LIMIT_SECONDS
            row.record(
                f"honest GetPlan: max {worst} s, median {summary['median_seconds']} s over {summary['probes']} probes, "
                f"{summary['failed']} failed; attacker streams: {dict(codes)}",
                ok and self.aggregator.alive,
                latency=summary,
                loops=loops,
                attacker_streams=dict(codes),
            )

    def _flood_row(self, context: StageContext) -> None:
        count, seconds = self.sizes.flood_connections, self.sizes.flood_seconds
        with self.book.row(
            f"TCP flood ({count} connections that never start a TLS handshake)",
            f"honest GetPlan on new and existing connections answered within {LATENCY_LIMIT_SECONDS:g} s; "
            "the aggregator keeps serving",
        ) as row:
            sockets = idle_connections(self.address, count)
            try:
                fresh = LatencyProbe(self.address, self.credentials.honest, FEDERATION_ID, fresh_connections=True)
                shared = LatencyProbe(self.address, self.credentials.honest, FEDERATION_ID)
                with fresh, shared:
                    time.sleep(seconds)
            finally:
                for connection in sockets:
                    connection.close()
            summaries = {"new connections": fresh.summary(), "existing connection": shared.summary()}
            ok = all(
                summary["failed"] == 0
                and summary["max_seconds"] is not None
                and summary["max_seconds"] < LATENCY_LIMIT_SECONDS
                for summary in summaries.values()
            )
            row.record(
                f"{len(sockets)} idle connections held {seconds:g} s; "
                + "; ".join(
                    f"{what}: max {summary['max_seconds']} s, {summary['failed']} of {summary['probes']} failed"
                    for what, summary in summaries.items()
                ),
                ok and self.aggregator.alive,
                connections=len(sockets),
                latency=summaries,
            )

    # ------------------------------------------------------------ status reports

    def _report_rows(self, context: StageContext) -> None:
        """Abuse of the Report RPC (see :mod:`attacks.report_attacks`); it never uses up the insider's slot."""
        attacks = ReportAttacks(
            self.book, self.insider.channel, self.workspace.output, refused, lambda: self.aggregator.alive
        )
        attacks.run(context.round)

    # ------------------------------------------------------------ the fuzz

    def _fuzz_batch(self, context: StageContext) -> None:
        assert self._campaign is not None  # made in run()
        self.fuzz_rounds.add(context.round)
        target = fuzz.Target(
            FEDERATION_ID,
            context.binding,
            bind(FEDERATION_ID, context.round, pb.STAGE_TRAIN),
            self._genuine_payload(context),
            VALUE_ATTACKS["weight 0"](context),
        )
        before = len(self._campaign.stats.accepted)
        count = math.ceil(self.sizes.fuzz_messages / self.sizes.fuzz_rounds)
        self._campaign.run(target, count, lambda: self.aggregator.alive)
        for accepted in self._campaign.stats.accepted[before:]:
            if accepted.identity == INSIDER and accepted.binding == context.binding:
                context.consumed = True
                self.insider_uploads[context.round] = accepted.payload

    # ------------------------------------------------------------ after the run

    def _sent(self, record: Mapping[str, Any]) -> Sent | str:
        """What each contributor of an applied round sent (honest: their exact update; the insider: its receipt)."""
        number = int(record["round"])
        plan = load_plan(self.workspace)
        parameters = self._parameters or int(initial_state(plan).theta.numel())
        vectors: dict[str, np.ndarray] = {}
        problems: list[str] = []
        for name in record.get("contributors", []):
            if name in HONEST:
                vectors[name] = plain_vector(exact_update(name, parameters))
            elif name == INSIDER:
                payload = self.insider_uploads.get(number, b"")
                if number not in self.insider_uploads:
                    # Counted, yet every insider upload of the round was answered with an error: the
                    # likeliest content is the valid update the fuzz mutated (the replay checks it).
                    problems.append("the aggregator counted an insider upload that it answered with an error")
                    payload = self._genuine_payload_for(parameters)
                if payload is None:
                    return f"round {number}: an insider upload was acknowledged that cannot be reconstructed"
                if len(payload) != plain_upload_size(parameters + 1, pb.STAGE_MASKED_INPUT):
                    return f"round {number}: an insider upload of {len(payload)} bytes was counted (not a plain update)"
                values, weight = read_plain_upload(payload, pb.STAGE_MASKED_INPUT)
                vector = np.append(values.astype(np.float64), weight)
                vectors[name] = vector
                problems += _out_of_bounds(vector, plan.secure_aggregation.clip, plan.secure_aggregation.max_weight)
            else:
                return f"round {number}: {name!r} is not a party of this federation"
        return Sent(vectors, tuple(problems))

    def _final_rows(
        self, check: RoundCheck, finished: bool, stuck: list[str], code: int | None, errors: dict[str, str]
    ) -> None:
        log = read_round_log(self.workspace.output)
        last = int(log[-1]["round"]) if log else None
        row = self.book.add(
            Row(
                "after the attacks: honest collaborators complete a round with the right sum",
                "the last round is applied with every party's genuine update, and every applied round of the run "
                "is exactly what the parties sent",
                CHECK,
            )
        )
        row.seconds = float(log[-1].get("seconds", 0.0)) if log else 0.0
        problems = []
        if not finished or stuck or code != 0:
            problems.append(
                f"the run did not finish cleanly (insider finished: {finished}, still running: {stuck}, "
                f"aggregator exit: {code})"
            )
        if errors or self.insider.errors:
            problems.append(f"errors: {errors or ''} {self.insider.errors[:3]}")
        if check.invalid:
            problems.append(f"invalid rounds: {check.invalid}")
        if check.unverified:
            problems.append(f"unverified rounds: {check.unverified}")
        if last is None or last not in check.verified:
            problems.append(f"the last round ({last}) is not a verified, applied round")
        row.record(
            "; ".join(problems)
            if problems
            else f"{len(check.verified)} applied rounds replayed exactly, the last one (round {last}) included",
            not problems,
            verified_rounds=len(check.verified),
            aggregator_log_problems=self.aggregator.problems()[:10],
        )

    def _fuzz_summary(self, check: RoundCheck) -> dict[str, Any]:
        stats = self._campaign.stats if self._campaign is not None else fuzz.FuzzStats()
        invalid = [number for number in check.invalid if number in self.fuzz_rounds]
        unverified = [number for number in check.unverified if number in self.fuzz_rounds]
        summary = stats.to_json()
        return {
            "messages": stats.messages,
            "crashes": stats.crashes,
            "hangs": stats.hangs,
            "invalid_rounds_applied": len(invalid) + len(unverified),
            "rounds": sorted(self.fuzz_rounds),
            "invalid_rounds": {number: check.invalid[number] for number in invalid},
            "unverified_rounds": unverified,
            **{key: value for key, value in summary.items() if key not in ("messages", "crashes", "hangs")},
        }


def _out_of_bounds(vector: np.ndarray, clip: float, max_weight: float) -> list[str]:
    """Why a plain update the aggregator accepted breaks the plan's bounds (the encoding's, in secure mode)."""
    weight = float(vector[-1])
    if not np.isfinite(vector).all():
        return ["an accepted update holds NaN or Inf"]
    if not 0.0 < weight <= max_weight:
        return [f"an accepted update's weight {weight:g} is outside (0, {max_weight:g}]"]
    if np.abs(vector[:-1]).max(initial=0.0) > clip * weight:
        return [f"an accepted update exceeds clip x weight ({np.abs(vector[:-1]).max():.3g} > {clip * weight:g})"]
    return []


def _vector(context: StageContext, value: float, *, at: int = 3, weight: float | None = None) -> bytes:
    update = exact_update(INSIDER, context.dimension - 1)
    vector = np.append(update.weighted_vector().numpy(), update.weight)
    vector[at] = value
    if weight is not None:
        vector[-1] = weight
    return plain_payload(vector[:-1], vector[-1])


VALUE_ATTACKS: dict[str, Callable[[StageContext], bytes]] = {
    "NaN in a plain update": lambda c: _vector(c, math.nan),
    "+Inf in a plain update": lambda c: _vector(c, math.inf),
    "-Inf in a plain update": lambda c: _vector(c, -math.inf),
    "huge value (1e30, finite in float32) in a plain update": lambda c: _vector(c, 1e30),
    "a coordinate just outside clip x weight": lambda c: _vector(c, 1.01 * c.clip * 10.0, weight=10.0),
    "weight 0": lambda c: _vector(c, 0.0, weight=0.0),
    "negative weight (-5)": lambda c: _vector(c, 0.0, weight=-5.0),
    "weight 1e9 > max_weight": lambda c: _vector(c, 0.0, weight=1e9),
    "NaN weight": lambda c: _vector(c, 0.0, weight=math.nan),
    "wrong length (one value short)": lambda c: plain_payload(np.zeros(c.dimension - 1), 10.0),
}
"""Plain uploads the aggregator must refuse, each built from the insider's genuine update."""
