"""Mutated and random messages on every RPC of a live aggregator, from the wire schema alone.

Each message starts from a valid request for the stage open now (built with the
generated protobuf classes) and is then mutated: bits flipped, cut short, extended,
fields swapped or set to extreme values, or replaced by random bytes or random
protobuf wire data; a Submit stream is also re-chunked, reordered, duplicated or
emptied, and a Send may carry only the first part of a longer upload. Requests go out
as raw bytes (:class:`~attacks.hostile_client.RawFederation`), so the aggregator parses
exactly what was mutated.

What counts (``FuzzStats``):

- a crash: an RPC that ended UNKNOWN or INTERNAL (a handler raised what it did not
  expect: gRPC's ``Exception calling application`` or the aggregator's own generic
  internal error), or the aggregator process dying (the caller's ``alive`` check);
- a hang: an RPC that ran past its deadline, except a task stream that is valid and
  so stays open by design;
- every upload the aggregator accepted (a Receipt), with the exact payload it
  reassembled when the fuzzer can reconstruct it, so the caller can check the round
  log against what was really accepted.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from attacks.fuzz_mutations import BYTE_MUTATIONS, field_mutation, random_wire
from attacks.hostile_client import WIRE_VERSION, RawFederation, bind, join_binding, parts
from fedfair.runtime.transport import fedfair_pb2 as pb

FUZZ_DEADLINE_SECONDS = 5.0
"""Longest a fuzzed request may take before it counts as a hang."""
STREAM_PROBE_SECONDS = 0.2
"""How long a valid task stream is held before the fuzzer hangs up (it stays open by design)."""

RPC_WEIGHTS = {
    "Submit": 0.30,
    "Send": 0.12,
    "Fetch": 0.14,
    "DownloadModel": 0.14,
    "GetPlan": 0.14,
    "WaitForTasks": 0.10,
    "Report": 0.06,
}
CRASH_CODES = ("UNKNOWN", "INTERNAL")
LAST_PHASE = 0.1
"""The last share of each batch, where upload mutations (Submit, Send) may start from the valid upload: an
accepted one uses up the sender's slot for the stage, and every later upload is refused at the door."""
VALID_SHARE = 0.5
"""In the last phase, the share of upload mutations that start from the valid upload."""


@dataclass(frozen=True)
class Target:
    """The live stage the fuzzer aims at: its binding, the round's TRAIN binding, and two uploads for it.

    ``valid_upload`` is one the aggregator takes; ``refused_upload`` is framed the same but its
    content must be refused (a plain update with weight 0). Upload mutations start from the
    refused one, so they reach the aggregator's decoder without using up the sender's one slot
    per stage, except in the last phase of a batch, where some start from the valid one, so an
    accepted mutation is possible too (and is then checked against the round log).
    """

    federation_id: str
    open_stage: pb.Binding
    train_stage: pb.Binding
    valid_upload: bytes
    refused_upload: bytes


@dataclass(frozen=True)
class AcceptedUpload:
    """An upload the aggregator took: its binding and the payload (None if it could not be reconstructed)."""

    binding: pb.Binding
    payload: bytes | None
    identity: str


@dataclass(frozen=True)
class Outcome:
    """How the aggregator answered one fuzzed request."""

    code: str
    details: str
    seconds: float
    stays_open: bool = False
    """A valid task stream: it stays open by design, so running into its deadline is no hang."""
    accepted: AcceptedUpload | None = None


@dataclass
class FuzzStats:
    """What a fuzz campaign sent and how the aggregator answered."""

    messages: int = 0
    crashes: int = 0
    hangs: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    by_rpc: Counter[str] = field(default_factory=Counter)
    by_rpc_status: Counter[tuple[str, str]] = field(default_factory=Counter)
    by_mutation: Counter[str] = field(default_factory=Counter)
    crash_examples: list[str] = field(default_factory=list)
    hang_examples: list[str] = field(default_factory=list)
    accepted: list[AcceptedUpload] = field(default_factory=list)
    streams_held_open: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "crashes": self.crashes,
            "hangs": self.hangs,
            "statuses": dict(self.statuses.most_common()),
            "by_rpc": {
                rpc: {code: n for (name, code), n in self.by_rpc_status.most_common() if name == rpc}
                for rpc in self.by_rpc
            },
            "by_mutation": dict(self.by_mutation),
            "crash_examples": self.crash_examples[:10],
            "hang_examples": self.hang_examples[:10],
            "uploads_accepted": len(self.accepted),
            "valid_task_streams_held_open": self.streams_held_open,
            "seconds": round(self.seconds, 2),
        }


# ---------------------------------------------------------------- the campaign


class Campaign:
    """Sends mutated requests from several identities and threads; accumulates :class:`FuzzStats`."""

    def __init__(
        self,
        identities: dict[str, RawFederation],
        allowed: Iterable[str],
        *,
        seed: int,
        workers: int = 6,
    ) -> None:
        self.identities = identities
        self.allowed = frozenset(allowed)
        self.seed = seed
        self.workers = workers
        self.stats = FuzzStats()
        self._lock = threading.Lock()
        self._batches = 0

    def run(self, target: Target, count: int, alive: Callable[[], bool]) -> None:
        """Send `count` messages at `target` (spread over the worker threads); count a dead server as a crash."""
        started = time.perf_counter()
        last = int(count * LAST_PHASE)
        for phase, (messages, valid_share) in enumerate(((count - last, 0.0), (last, VALID_SHARE))):
            self._batches += 1
            shares = [
                messages // self.workers + (1 if index < messages % self.workers else 0)
                for index in range(self.workers)
            ]
            threads = [
                threading.Thread(
                    target=self._worker,
                    args=(target, share, valid_share, random.Random(self.seed * 1_000 + self._batches * 100 + index)),
                    name=f"fuzz-{phase}-{index}",
                    daemon=True,
                )
                for index, share in enumerate(shares)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if not alive():
            with self._lock:
                self.stats.crashes += 1
                self.stats.crash_examples.append("the aggregator process died during the fuzz")
        self.stats.seconds += time.perf_counter() - started

    def _worker(self, target: Target, count: int, valid_share: float, rng: random.Random) -> None:
        names = sorted(self.identities)
        rpcs, weights = zip(*RPC_WEIGHTS.items(), strict=True)
        for _ in range(count):
            # Mostly an allowed identity, so mutations reach the handlers rather than the door.
            identity = rng.choice([name for name in names if name in self.allowed] * 4 + names)
            rpc = rng.choices(rpcs, weights)[0]
            if rpc == "Submit":
                mutation, outcome = self._submit(rng, target, identity, valid_share)
            elif rpc == "Send":
                mutation, outcome = self._send(rng, target, identity, valid_share)
            else:
                mutation, outcome = self._request(rng, target, identity, rpc)
            self._count(rpc, mutation, identity, outcome)

    # ------------------------------------------------------------ one request

    def _request(self, rng: random.Random, target: Target, identity: str, rpc: str) -> tuple[str, Outcome]:
        """One mutated request message to an RPC that takes one and is no upload (not Submit or Send)."""
        base = self._base_request(rng, target, rpc)
        mutation, data = self._mutate_message(rng, base)
        raw = self.identities[identity]
        stream_ok = rpc == "WaitForTasks" and identity in self.allowed and self._valid_stream(target, data)
        deadline = STREAM_PROBE_SECONDS if stream_ok else FUZZ_DEADLINE_SECONDS
        calls: dict[str, Callable[..., Any]] = {
            "GetPlan": raw.get_plan,
            "WaitForTasks": raw.wait_for_tasks,
            "DownloadModel": raw.download_model,
            "Fetch": raw.fetch,
            "Report": raw.report,
        }
        call = calls[rpc]
        started = time.perf_counter()
        try:
            reply = call(data, timeout=deadline)
            if rpc not in ("GetPlan", "Report"):  # the unary ones; the others stream their reply
                for _ in reply:
                    pass
            code, details = "OK", ""
        except grpc.RpcError as error:
            status = error.code()
            code, details = (status.name if status is not None else "UNKNOWN"), error.details() or ""
        return mutation, Outcome(code, details, time.perf_counter() - started, stays_open=stream_ok)

    def _submit(self, rng: random.Random, target: Target, identity: str, valid_share: float) -> tuple[str, Outcome]:
        """One Submit stream: a valid upload re-chunked, then one part mutated, or the stream itself."""
        upload = target.valid_upload if rng.random() < valid_share else target.refused_upload
        chunk = rng.choice((len(upload) or 1, 1 << 20, max(1, len(upload) // rng.randint(2, 8))))
        messages = [item.SerializeToString() for item in parts(target.open_stage, upload, chunk)]
        mutation = rng.choice(("part", "part", "part", "fields", "drop", "duplicate", "reorder", "empty", "append"))
        if mutation == "part":
            index = rng.randrange(len(messages))
            name = rng.choice(sorted(BYTE_MUTATIONS))
            messages[index] = BYTE_MUTATIONS[name](rng, messages[index])
            mutation = f"part:{name}"
        elif mutation == "fields":
            index = rng.randrange(len(messages))
            messages[index] = field_mutation(rng, pb.Part.FromString(messages[index])).SerializeToString()
        elif mutation == "drop" and len(messages) > 1:
            del messages[rng.randrange(len(messages))]
        elif mutation == "duplicate":
            index = rng.randrange(len(messages))
            messages.insert(index, messages[index])
        elif mutation == "reorder":
            rng.shuffle(messages)
        elif mutation == "empty":
            messages = []
        else:
            messages.append(rng.choice(messages) if rng.random() < 0.5 else random_wire(rng, b""))
            mutation = "append"
        return f"submit:{mutation}", self._upload(identity, messages, stream=True)

    def _send(self, rng: random.Random, target: Target, identity: str, valid_share: float) -> tuple[str, Outcome]:
        """One Send: a whole upload as one part with its bytes or fields mutated, or the first part of
        the upload cut into several."""
        upload = target.valid_upload if rng.random() < valid_share else target.refused_upload
        mutation = rng.choice(("bytes", "bytes", "fields", "first-part"))
        chunk = max(1, len(upload) // rng.randint(2, 8)) if mutation == "first-part" else len(upload) or 1
        message = parts(target.open_stage, upload, chunk)[0].SerializeToString()
        if mutation == "bytes":
            name = rng.choice(sorted(BYTE_MUTATIONS))
            message = BYTE_MUTATIONS[name](rng, message)
            mutation = f"bytes:{name}"
        elif mutation == "fields":
            message = field_mutation(rng, pb.Part.FromString(message)).SerializeToString()
        return f"send:{mutation}", self._upload(identity, [message], stream=False)

    def _upload(self, identity: str, messages: list[bytes], *, stream: bool) -> Outcome:
        """Upload `messages` as `identity`: a Submit stream of them, or (not `stream`) a Send of the one
        message; what came back, with the upload rebuilt if the aggregator accepted it."""
        raw = self.identities[identity]
        started = time.perf_counter()
        try:
            if stream:
                reply = raw.submit(iter(messages), timeout=FUZZ_DEADLINE_SECONDS)
            else:
                [message] = messages
                reply = raw.send(message, timeout=FUZZ_DEADLINE_SECONDS)
        except grpc.RpcError as error:
            status = error.code()
            code, details = (status.name if status is not None else "UNKNOWN"), error.details() or ""
            return Outcome(code, details, time.perf_counter() - started)
        return Outcome("OK", "", time.perf_counter() - started, accepted=self._accepted(messages, reply, identity))

    @staticmethod
    def _accepted(messages: list[bytes], reply: bytes, identity: str) -> AcceptedUpload:
        """The upload a Receipt acknowledges, rebuilt from what was sent and checked against its SHA-256."""
        receipt = pb.Receipt.FromString(reply)
        try:
            sent = [pb.Part.FromString(message) for message in messages]
        except Exception:  # noqa: BLE001 -- protobuf's DecodeError: the server took something we cannot read
            return AcceptedUpload(receipt.binding, None, identity)
        payload = b"".join(item.chunk.data for item in sent)
        if hashlib.sha256(payload).digest() != receipt.sha256 or len(payload) != receipt.received_size:
            return AcceptedUpload(receipt.binding, None, identity)
        return AcceptedUpload(receipt.binding, payload, identity)

    # ------------------------------------------------------------ bases and bookkeeping

    @staticmethod
    def _base_request(rng: random.Random, target: Target, rpc: str) -> Any:
        federation = target.federation_id
        if rpc == "GetPlan":
            return pb.PlanRequest(
                binding=rng.choice((join_binding(federation), target.open_stage)), wire_version=WIRE_VERSION
            )
        if rpc == "WaitForTasks":
            return pb.TaskRequest(after=rng.choice((join_binding(federation), target.train_stage)))
        if rpc == "DownloadModel":
            return pb.FetchRequest(binding=target.train_stage)
        if rpc == "Report":
            return pb.StatusReport(
                binding=rng.choice((join_binding(federation), target.open_stage)),
                status=rng.choice((pb.COLLABORATOR_STATUS_BUDGET_SPENT, pb.COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT)),
                epsilon=rng.choice((None, 1.5)),
            )
        return pb.FetchRequest(
            binding=rng.choice(
                (target.open_stage, bind(federation, target.open_stage.round, (pb.STAGE_UNSPECIFIED, 0)))
            )
        )

    @staticmethod
    def _mutate_message(rng: random.Random, base: Any) -> tuple[str, bytes]:
        if rng.random() < 0.3:
            return "fields", field_mutation(rng, base).SerializeToString()
        name = rng.choice(sorted(BYTE_MUTATIONS))
        return name, BYTE_MUTATIONS[name](rng, base.SerializeToString())

    @staticmethod
    def _valid_stream(target: Target, data: bytes) -> bool:
        """Whether a task-stream request is one the aggregator should accept and keep open."""
        try:
            request = pb.TaskRequest.FromString(data)
        except Exception:  # noqa: BLE001 -- protobuf's DecodeError
            return False
        return request.after.federation_id == target.federation_id

    def _count(self, rpc: str, mutation: str, identity: str, outcome: Outcome) -> None:
        with self._lock:
            stats = self.stats
            stats.messages += 1
            stats.statuses[outcome.code] += 1
            stats.by_rpc[rpc] += 1
            stats.by_rpc_status[(rpc, outcome.code)] += 1
            stats.by_mutation[mutation] += 1
            if outcome.accepted is not None:
                stats.accepted.append(outcome.accepted)
            if outcome.code in CRASH_CODES:
                stats.crashes += 1
                stats.crash_examples.append(f"{rpc} {mutation} as {identity}: {outcome.code} {outcome.details[:200]!r}")
            elif outcome.code == "DEADLINE_EXCEEDED":
                if outcome.stays_open:
                    stats.streams_held_open += 1
                else:
                    stats.hangs += 1
                    stats.hang_examples.append(f"{rpc} {mutation} as {identity}: no answer in {outcome.seconds:.1f} s")
