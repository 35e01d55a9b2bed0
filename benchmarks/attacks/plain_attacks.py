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
The rows themselves are :class:`~attacks.door_attacks.DoorAttacks`' and
:class:`~attacks.flood_attacks.FloodAttacks`' (the Report RPC's, :mod:`attacks.report_attacks`).
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attacks import fuzz
from attacks.hostile_client import named_stage, stage_of
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
from attacks.hostile_client import RawFederation, TaskFollower, bind, fetch, open_channel, parts, submit
from attacks.report_attacks import ReportAttacks
from attacks.plain_stage import Sizes, refused, StageContext, Job
from attacks.door_attacks import DoorAttacks, VALUE_ATTACKS
from attacks.flood_attacks import FloodAttacks
from attacks.rows import CHECK, Row, RowBook
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.transport import fedfair_pb2 as pb
from fedfair.runtime.contract import TRAINING
from fedfair.runtime.transport.chunks import plain_upload_size, read_plain_upload

HELD = HONEST[-1]
"""The honest collaborator whose MASKED_INPUT upload waits until the insider is done with the stage."""
HOLD_SECONDS = 300.0


@dataclass
class PlainAttacks(DoorAttacks, FloodAttacks):
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
            if stage_of(task.binding) == named_stage("STAGE_MASKED_INPUT"):
                self._stage_done(int(task.binding.round)).wait(HOLD_SECONDS)
            step(stub, task)

        collaborator.step = held_step  # type: ignore[method-assign]

    def _stage_done(self, round_number: int) -> threading.Event:
        with self._lock:
            return self._done.setdefault(round_number, threading.Event())

    def _on_task(self, follower: TaskFollower, task: pb.Task) -> None:
        stage = stage_of(task.binding)
        if stage == named_stage("STAGE_MASKED_INPUT"):
            self._masked_input(follower, task)
        elif stage == named_stage("STAGE_EVAL_MASKED_INPUT"):
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
            bind(FEDERATION_ID, context.round, named_stage("STAGE_TRAIN")),
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
                if len(payload) != plain_upload_size(parameters + 1, TRAINING.plain_values):
                    return f"round {number}: an insider upload of {len(payload)} bytes was counted (not a plain update)"
                values, weight = read_plain_upload(payload, TRAINING.plain_values)
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
