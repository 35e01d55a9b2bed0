"""Attacks on the six-stage secure aggregation by collaborators: forged keys, garbage shares, bad unmasking.

The federation (secure aggregation on): the real aggregator as an OS process; three honest
collaborators and a fourth, *patched*, one (fedfair's own collaborator whose unmasking
upload is corrupted in chosen rounds), all in threads with exact fixed updates; and the
*insider*, a listed collaborator whose process is the hostile client, crafting
secure-aggregation payloads from the protocol's published encoding
(:mod:`attacks.secagg_wire`).

Round by round:

1. ADVERTISE: impersonation, an unsigned advertisement, a certificate with a flipped
   byte, another party's certificate, a signature over another round's parameters; then
   the insider's genuine advertisement, the control that must be accepted for the
   refusals to count. It then drops out.
2. ADVERTISE: last round's advertisement replayed as it was and re-bound to this round;
   the genuine one again. SHARE: validly signed entries with garbage ciphertexts. CHECK:
   a signed check accusing nobody. The honest parties must accuse the insider and the
   round complete without it (not abort).
3. The patched collaborator reveals one corrupt share when unmasking.
4. It withholds its shares (an unmask response with none); 5. it sends no response at all.
6. Nobody attacks: the honest round after the attacks.

Every applied round is replayed from the honest updates (:func:`~attacks.round_check.check_rounds`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attacks.hostile_client import Stage, named_stage, stage_name, stage_of
from attacks.federation import (
    FEDERATION_ID,
    HONEST,
    INSIDER,
    PATCHED,
    AggregatorProcess,
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
from attacks.hostile_client import Answer, TaskFollower, bind, fetch, parts, submit
from attacks.rows import CHECK, PATCHED_COLLABORATOR, PURE, Row, RowBook
from attacks.secagg_wire import (
    RoundInfo,
    RoundKeys,
    advertisement,
    certificate_der,
    load_identity_key,
    parse_key_directory,
    session_id,
    share_check,
    share_keys,
)
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.transport import fedfair_pb2 as pb
from fedfair.secagg import messages

ROUNDS = 6
# The corrupt share comes last: the aggregator proves it and excludes the patched collaborator
# from every later round, as it excluded the insider after its garbage shares.
FORGERY_ROUND, GARBAGE_ROUND, EMPTY_ROUND, SILENT_ROUND, CORRUPT_ROUND = 1, 2, 3, 4, 5
HELD = HONEST[-1]
"""The honest collaborator whose ADVERTISE upload waits while the insider attacks that stage (so it stays open)."""
HOLD_SECONDS = 120.0
EXPECTED_CONTRIBUTORS = sorted((*HONEST, PATCHED))
INVALID = ("INVALID_ARGUMENT",)


@dataclass
class Pending:
    """A forged-advertisement row waiting for its control: a refusal only counts if the genuine one passes."""

    row: Row
    answer: Answer
    codes: tuple[str, ...]


@dataclass
class SecureAttacks:
    """Runs the secure federation and the attacks on its six stages; fills `book` with their rows."""

    root: Path
    book: RowBook
    keys: dict[int, RoundKeys] = field(default_factory=dict)
    infos: dict[int, RoundInfo] = field(default_factory=dict)
    sessions: dict[int, bytes] = field(default_factory=dict)
    advertisements: dict[int, bytes] = field(default_factory=dict)
    insider_stages: dict[int, list[str]] = field(default_factory=dict)
    patched_uploads: dict[int, str] = field(default_factory=dict)
    _garbage: Answer | None = None
    _done: dict[tuple[int, Stage], threading.Event] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        names = (*HONEST, PATCHED, INSIDER)
        # The insider's garbage shares get it accused by every honest party, and the patched
        # collaborator's corrupt share is proved: both are excluded from the later rounds, so the
        # honest parties alone must still make a quorum.
        sections = plan_sections(secure=True, rounds=ROUNDS, quorum=len(HONEST), timeout=30.0)
        self.workspace = attack_workspace(self.root, names, sections)
        credentials = attack_credentials(self.workspace)
        assert credentials.insider.cert is not None and credentials.insider.key is not None  # made above
        self.signer = load_identity_key(credentials.insider.key.read_bytes())
        self.own_credential = certificate_der(credentials.insider.cert.read_bytes())
        self.victim_credential = certificate_der((self.workspace.certs / f"{HONEST[0]}.crt").read_bytes())
        aggregator = AggregatorProcess(self.workspace)
        self.aggregator = aggregator
        group = HonestCollaborators.start(
            self.workspace, (*HONEST, PATCHED), lambda name: trainer_factory(name, FixedTrainer), adjust=self._adjust
        )
        insider = TaskFollower(self.workspace.address, credentials.insider, FEDERATION_ID, self._on_task)
        self.insider = insider
        insider.start()
        try:
            finished = insider.join(timeout=300)
            stuck = group.join(timeout=60)
            code = aggregator.wait(30)
        finally:
            insider.stop()
            group.stop()
            aggregator.stop()
        check = check_rounds(load_plan(self.workspace), self.workspace, self._sent)
        self._outcome_rows(check)
        self._final_row(check, finished and not stuck and code == 0, group.errors)

    # ------------------------------------------------------------ collaborators

    def _adjust(self, name: str, collaborator: Collaborator) -> None:
        if name == HELD:
            self._hold(collaborator)
        if name == PATCHED:
            self._corrupt_unmasking(collaborator)

    def _hold(self, collaborator: Collaborator) -> None:
        """Keep one honest ADVERTISE upload back while the insider attacks that stage (so it stays open)."""
        step = collaborator.step

        def held_step(stub: Any, task: pb.Task) -> None:
            key = (int(task.binding.round), stage_of(task.binding))
            if stage_of(task.binding) == named_stage("STAGE_ADVERTISE_KEYS") and key[0] in (
                FORGERY_ROUND,
                GARBAGE_ROUND,
            ):
                self._stage_done(key).wait(HOLD_SECONDS)
            step(stub, task)

        collaborator.step = held_step  # type: ignore[method-assign]

    def _stage_done(self, key: tuple[int, Stage]) -> threading.Event:
        with self._lock:
            return self._done.setdefault(key, threading.Event())

    def _corrupt_unmasking(self, collaborator: Collaborator) -> None:
        """The patched collaborator: its genuine UNMASK upload, corrupted in the chosen rounds."""
        send = collaborator.submit

        def submit_patched(stub: Any, binding: pb.Binding, payload: bytes) -> None:
            number = int(binding.round)
            if (
                stage_of(binding) != named_stage("STAGE_UNMASK")
                or not payload
                or number not in (CORRUPT_ROUND, EMPTY_ROUND, SILENT_ROUND)
            ):
                send(stub, binding, payload)
                return
            response = messages.UnmaskResponse.from_bytes(payload)
            if number == SILENT_ROUND:
                self.patched_uploads[number] = "sent nothing"
                return
            if number == EMPTY_ROUND:
                response = dataclasses.replace(response, seed_shares=(), key_shares=())
                self.patched_uploads[number] = "sent an unmask response with no share"
            else:
                first = response.seed_shares[0]
                flipped = bytearray(first.share)
                flipped[-1] ^= 0x01
                bad = dataclasses.replace(first, share=bytes(flipped))
                response = dataclasses.replace(response, seed_shares=(bad, *response.seed_shares[1:]))
                self.patched_uploads[number] = f"flipped a bit of its share of party {first.owner}'s seed"
            send(stub, binding, response.to_bytes())

        collaborator.submit = submit_patched  # type: ignore[method-assign]

    # ------------------------------------------------------------ the insider

    def _on_task(self, follower: TaskFollower, task: pb.Task) -> None:
        number, stage = int(task.binding.round), stage_of(task.binding)
        self.insider_stages.setdefault(number, []).append(stage_name(stage_of(task.binding)))
        try:
            if stage == named_stage("STAGE_ADVERTISE_KEYS") and number == FORGERY_ROUND:
                self._forgeries(follower, task)
            elif stage == named_stage("STAGE_ADVERTISE_KEYS") and number == GARBAGE_ROUND:
                self._replays(follower, task)
            elif stage == named_stage("STAGE_SHARE_KEYS") and number == GARBAGE_ROUND:
                self._garbage_shares(follower, task)
            elif stage == named_stage("STAGE_CHECK_SHARES") and number == GARBAGE_ROUND:
                self._accuse_nobody(follower, task)
            elif stage not in (named_stage("STAGE_TRAIN"), named_stage("STAGE_EVALUATE")):
                submit(follower.channel, parts(task.binding, b""))  # every other stage: the insider sits it out
        finally:
            self._stage_done((number, stage)).set()

    def _round_info(self, follower: TaskFollower, task: pb.Task) -> RoundInfo:
        answer = fetch(follower.channel, task.binding)
        if not answer.ok:
            raise RuntimeError(f"could not fetch the round parameters: {answer.describe()}")
        info = RoundInfo.parse(FEDERATION_ID, answer.reply)
        self.infos[info.round] = info
        return info

    def _forgeries(self, follower: TaskFollower, task: pb.Task) -> None:
        info = self._round_info(follower, task)
        me, victim = info.party_id(INSIDER), info.party_id(HONEST[0])
        keys = RoundKeys.fresh()
        flipped = bytearray(self.own_credential)
        flipped[-5] ^= 0x01  # inside the CA's signature: the DER still parses, the chain does not verify
        other_round = dataclasses.replace(info, round=info.round + 7)
        forgeries: list[tuple[str, bytes]] = [
            (
                "impersonation: an advertisement naming another party (its id and certificate)",
                advertisement(info, victim, keys, self.victim_credential, self.signer),
            ),
            ("unsigned key advertisement", advertisement(info, me, keys, self.own_credential, None)),
            (
                "mutated certificate inside an advertisement (one bit of the CA's signature flipped)",
                advertisement(info, me, keys, bytes(flipped), self.signer),
            ),
            (
                "another party's certificate inside one's own advertisement",
                advertisement(info, me, keys, self.victim_credential, self.signer),
            ),
            (
                "advertisement signed over another round's parameters",
                advertisement(info, me, keys, self.own_credential, self.signer, signed_over=other_round),
            ),
        ]
        pending = []
        for attack, payload in forgeries:
            with self.book.row(attack, "INVALID_ARGUMENT (generic); the genuine advertisement is then accepted") as row:
                pending.append(Pending(row, submit(follower.channel, parts(task.binding, payload)), INVALID))
        self._control(follower, task, info, keys, pending)

    def _replays(self, follower: TaskFollower, task: pb.Task) -> None:
        info = self._round_info(follower, task)
        earlier = self.advertisements.get(FORGERY_ROUND)
        pending = []
        cases = [
            (
                "replay: last round's advertisement as it was",
                bind(FEDERATION_ID, FORGERY_ROUND, named_stage("STAGE_ADVERTISE_KEYS")),
                ("FAILED_PRECONDITION",),
            ),
            ("replay: last round's advertisement re-bound to this round", task.binding, INVALID),
        ]
        for attack, binding, codes in cases:
            with self.book.row(attack, f"{codes[0]} (generic); the genuine advertisement is then accepted") as row:
                if earlier is None:
                    row.record("no earlier genuine advertisement to replay (its round failed)", False)
                    continue
                pending.append(Pending(row, submit(follower.channel, parts(binding, earlier)), codes))
        self._control(follower, task, info, RoundKeys.fresh(), pending)

    def _control(
        self, follower: TaskFollower, task: pb.Task, info: RoundInfo, keys: RoundKeys, pending: list[Pending]
    ) -> None:
        """The genuine advertisement: its acceptance is what makes the refusals before it meaningful."""
        payload = advertisement(info, info.party_id(INSIDER), keys, self.own_credential, self.signer)
        control = submit(follower.channel, parts(task.binding, payload))
        if control.ok:
            self.keys[info.round], self.advertisements[info.round] = keys, payload
        for item in pending:
            refused = item.answer.code in item.codes and "site-" not in item.answer.details
            if not control.ok:
                item.row.record(
                    f"{item.answer.describe()}, but inconclusive: the genuine control advertisement was refused "
                    f"too ({control.describe()}); the hostile encoding may be stale (attacks/secagg_wire.py)",
                    False,
                )
            else:
                item.row.record(f"{item.answer.describe()}; control accepted", refused)

    def _garbage_shares(self, follower: TaskFollower, task: pb.Task) -> None:
        info, keys = self.infos.get(GARBAGE_ROUND), self.keys.get(GARBAGE_ROUND)
        answer = fetch(follower.channel, task.binding)
        if info is None or keys is None or not answer.ok:
            self._garbage = Answer("NOT_RUN", f"no accepted advertisement or no key directory ({answer.describe()})", 0)
            return
        listed = parse_key_directory(answer.reply)
        me = info.party_id(INSIDER)
        if me not in {entry.sender for entry in listed}:
            self._garbage = Answer("NOT_RUN", "the key directory left the insider out", 0)
            return
        session = session_id(info.config_digest(), listed)
        self.sessions[GARBAGE_ROUND] = session
        recipients = sorted(entry.sender for entry in listed if entry.sender != me)
        payload = share_keys(info, session, me, recipients, self.signer, lambda _: os.urandom(12 + 150 + 16))
        self._garbage = submit(follower.channel, parts(task.binding, payload))

    def _accuse_nobody(self, follower: TaskFollower, task: pb.Task) -> None:
        info, session = self.infos.get(GARBAGE_ROUND), self.sessions.get(GARBAGE_ROUND)
        if info is None or session is None:
            submit(follower.channel, parts(task.binding, b""))
            return
        payload = share_check(info, session, info.party_id(INSIDER), [], self.signer)
        submit(follower.channel, parts(task.binding, payload))

    # ------------------------------------------------------------ outcomes

    def _sent(self, record: Mapping[str, Any]) -> Sent | str:
        parameters = int(initial_state(load_plan(self.workspace)).theta.numel())
        vectors = {}
        for name in record.get("contributors", []):
            if name not in EXPECTED_CONTRIBUTORS:
                return f"round {record['round']}: {name!r} was counted, but only the honest parties sent a real update"
            vectors[name] = plain_vector(exact_update(name, parameters))
        return Sent(vectors)

    def _round(self, number: int) -> dict[str, Any] | None:
        return next((record for record in read_round_log(self.workspace.output) if record["round"] == number), None)

    def _corrupter_excluded(self) -> bool:
        """Whether the aggregator proved the corrupt share and excluded its sender. It may not: UNMASK
        closes as soon as the honest shares rebuild every secret, and a later share is never looked at."""
        record = self._round(CORRUPT_ROUND) or {}
        return PATCHED in (record.get("excluded") or {})

    def _round_seconds(self, number: int) -> float:
        """How long the aggregator took for round `number` (what the attack cost the round)."""
        record = self._round(number)
        return float(record.get("seconds", 0.0)) if record is not None else 0.0

    def _applied_exactly(self, check: RoundCheck, number: int) -> tuple[bool, str]:
        record = self._round(number)
        if record is None:
            return False, f"round {number} never ran"
        status, contributors = record.get("status"), record.get("contributors")
        exact = number in check.verified
        text = f"round {number}: {status}" + (
            f", contributors {contributors}, sum {'exact' if exact else 'NOT the honest sum'}"
            if status == "applied"
            else f" ({record.get('reason', '')[:200]})"
        )
        excluded_before = number > CORRUPT_ROUND and self._corrupter_excluded()
        expected = sorted(HONEST) if excluded_before else EXPECTED_CONTRIBUTORS
        return status == "applied" and contributors == expected and exact, text

    def _outcome_rows(self, check: RoundCheck) -> None:
        garbage = self.book.add(
            Row(
                "garbage share ciphertexts (validly signed entries)",
                "the upload is taken; the honest recipients accuse the insider at CHECK_SHARES, it is left out of "
                "the masking set, and the round completes with the four honest parties (no abort)",
                PURE,
            )
        )
        ok, text = self._applied_exactly(check, GARBAGE_ROUND)
        garbage.seconds = self._round_seconds(GARBAGE_ROUND)
        stages = self.insider_stages.get(GARBAGE_ROUND, [])
        excluded = "STAGE_MASKED_INPUT" not in stages
        sent = self._garbage.describe() if self._garbage is not None else "never sent"
        garbage.record(
            f"ShareKeys: {sent}; insider {'left out of' if excluded else 'kept in'} the masking set; {text}",
            ok and excluded and self._garbage is not None and self._garbage.ok,
            insider_stages=stages,
        )
        for number, attack in (
            (CORRUPT_ROUND, "corrupt unmask share"),
            (EMPTY_ROUND, "withheld unmask shares (a response with none)"),
            (SILENT_ROUND, "withheld unmask shares (no response)"),
        ):
            row = self.book.add(
                Row(
                    attack,
                    "the aggregator rebuilds every secret from the honest shares and verifies it; the round completes "
                    "with every masked input in an exact sum",
                    PATCHED_COLLABORATOR,
                )
            )
            ok, text = self._applied_exactly(check, number)
            row.seconds = self._round_seconds(number)
            done = self.patched_uploads.get(number)
            row.record(f"patched collaborator {done or 'never reached UNMASK'}; {text}", ok and done is not None)

    def _final_row(self, check: RoundCheck, clean: bool, errors: dict[str, str]) -> None:
        row = self.book.add(
            Row(
                "after the secure attacks: honest collaborators complete a round with the right sum",
                f"round {ROUNDS} is applied with the honest parties (the insider excluded, and the share "
                "corrupter too if its share was proved bad) and its sum is exact; every applied round "
                "of the run is explained by the honest updates",
                CHECK,
            )
        )
        ok, text = self._applied_exactly(check, ROUNDS)
        row.seconds = self._round_seconds(ROUNDS)
        problems = [text] if not ok else []
        if check.invalid:
            problems.append(f"invalid rounds: {check.invalid}")
        if not clean or errors or self.insider.errors:
            problems.append(f"the run did not end cleanly: {errors} {self.insider.errors[:3]}")
        row.record(
            "; ".join(problems) if problems else f"{text}; {len(check.verified)} applied rounds replayed exactly",
            not problems,
            aggregator_log_problems=self.aggregator.problems()[:10],
        )
