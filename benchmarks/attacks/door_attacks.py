"""Who may talk to the aggregator at all, and what it takes: identities, malformed uploads, values, replays.

Rows of the plain federation (:mod:`attacks.plain_attacks`), each run by the insider against the MASKED_INPUT
stage it holds open (:class:`~attacks.plain_stage.InsiderStage`): certificates that must not get in, random bytes,
oversize and broken chunk streams, plain updates with values outside the plan's bounds (:data:`VALUE_ATTACKS`),
and uploads replayed into another round, federation or stage.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from attacks.hostile_client import named_stage
from attacks.federation import FEDERATION_ID, INSIDER, exact_update
from attacks.hostile_client import (
    Answer,
    Credentials,
    RawFederation,
    ask,
    bind,
    fetch,
    garbage_after_handshake,
    get_plan,
    join_binding,
    open_channel,
    part,
    parts,
    plain_payload,
    send,
    stub,
    submit,
)
from attacks.plain_stage import REFUSED_AT_DOOR, refused, StageContext, Job, InsiderStage
from fedfair.runtime.transport import fedfair_pb2 as pb
from fedfair.runtime.contract import TRAINING
from fedfair.runtime.transport.chunks import plain_upload_size


class DoorAttacks(InsiderStage):
    """The identity, malformed-upload, value and replay rows: methods of
    :class:`~attacks.plain_attacks.PlainAttacks`, which runs them in its insider's open stages."""

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
            train = bind(FEDERATION_ID, context.round, named_stage("STAGE_TRAIN"))

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
        binding, total = context.binding, plain_upload_size(context.dimension, TRAINING.plain_values)
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
        stage = named_stage("STAGE_MASKED_INPUT")
        cases = [
            ("replay: an upload of an earlier round", bind(FEDERATION_ID, earlier or 0, stage)),
            ("replay: a future round", bind(FEDERATION_ID, context.round + 1, stage)),
            ("replay: another federation's id", bind("another-federation", context.round, stage)),
            ("replay: another stage of this round", bind(FEDERATION_ID, context.round, named_stage("STAGE_TRAIN"))),
        ]
        for attack, binding in cases:
            with self.book.row(attack, "FAILED_PRECONDITION with generic details; nothing accepted") as row:
                answer = self._upload(context, parts(binding, payload))
                row.record(answer.describe(), refused(answer, ("FAILED_PRECONDITION",)), replayed_round=earlier)


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
