"""The aggregator's files: atomic checkpoints, the JSON-lines round log, the final model.

A state in a file (a large model's, :mod:`.state`) is written and read a span at a time (:mod:`.spanned`).

Why: docs/design.md, "Inside the aggregator".
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import pickle
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write, parse_json
from fedfair.core.server import ServerState
from fedfair.pki.roster import canonical_json
from fedfair.runtime.aggregator.spanned import Spanned, read_spanned, state_in_file, write_spanned
from fedfair.runtime.aggregator.state import AggregatorState, parameters
from fedfair.runtime.manifest_plan import setting_differences
from fedfair.runtime.observe.events import null_non_finite
from fedfair.runtime.state_files import InFile, holding, large
from fedfair.runtime.output_folder import CHECKPOINT_NAME, FINAL_MODEL_NAME, FINAL_SUMMARY_NAME, ROUND_LOG_NAME

logger = logging.getLogger("fedfair.aggregator")

FORMAT = "fedfair-aggregator-checkpoint"
VERSION = 1
DIGEST_PREFIX = b"fedfair-checkpoint sha256:"
"""The first line of a checkpoint file: this, the SHA-256 (hex) of the rest, a newline."""
ZIP_MAGIC = b"PK\x03\x04"
"""How a checkpoint from before digests (the bare torch.save file) begins."""

RESTORE = "restore it from a backup or start afresh"


@dataclass(frozen=True)
class Checkpoint:
    """The aggregator's state after round `round` (the wire round; aborted rounds count)."""

    round: int
    state: AggregatorState
    plan_digest: str
    evaluation: Mapping[str, Any] | None = None
    encoder: Mapping[str, Any] | None = None
    """The federation's encoder (Encoder.to_mapping) under a plan with a [schema]: made once, from the
    statistics aggregation, and kept so a resumed run serves exactly the same one."""
    plan: Mapping[str, Any] | None = None
    """What `plan_digest` fingerprints (:func:`plan_content`), None in checkpoints from before it was kept."""


def state_digest(state: AggregatorState) -> str:
    """SHA-256 of (theta, c, their averages, sigma with drift correction, the velocity with momentum).

    What the round log records at each round's start, so anyone can check that a resumed run starts from exactly
    the checkpointed model. Hashed a span at a time (in place in memory): the same digest wherever it is kept.
    """
    held = holding(state)
    digest = hashlib.sha256()

    def hash_tensor(field: str, length: int) -> None:
        for start, stop in held.spans(length):
            digest.update(np.ascontiguousarray(held.values(field, start, stop), dtype=np.float64).data)

    for field in ("theta", "theta_average"):
        hash_tensor(field, held.dimension)
    digest.update(json.dumps([held.c, held.c_average, held.averaged_rounds, held.round]).encode())
    for field in ("control", "velocity"):
        # After the rest, and only when there is one: a plan without drift correction or momentum keeps its digests.
        if held.has(field):
            hash_tensor(field, held.dimension + 1)
    return digest.hexdigest()


def _saved(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in float64 on the CPU, as torch.save should write it: its own values only.

    torch.save writes a tensor's whole storage, so a view into a larger one is cloned; a tensor that is all of
    its storage (the server state's are) is written as it is, which spares a copy of the model per tensor.
    """
    values = tensor.detach().to("cpu", torch.float64)
    whole = values.storage_offset() == 0 and values.untyped_storage().nbytes() == values.numel() * 8
    return values if whole and values.is_contiguous() else values.clone()


def _state_dict(state: AggregatorState) -> dict[str, Any]:
    """The checkpoint's ``state`` entry: tensors as torch.save writes them, or, from a file, :class:`Spanned`."""
    held = holding(state)

    def tensor(field: str) -> Any:
        return Spanned(held, field) if isinstance(state, InFile) else _saved(getattr(state, field))

    saved = {
        "round": held.round,
        "theta": tensor("theta"),
        "c": float(held.c),
        "theta_average": tensor("theta_average"),
        "c_average": float(held.c_average),
        "averaged_rounds": held.averaged_rounds,
    }
    for key in ("control", "velocity"):
        if held.has(key):
            saved[key] = tensor(key)
    return saved


def _writer(state: AggregatorState) -> Callable[[IO[bytes], Mapping[str, Any]], None]:
    """How a payload holding `state` is written: by torch.save in memory, a span at a time from a file."""
    if isinstance(state, InFile):
        return write_spanned
    return lambda stream, payload: torch.save(payload, stream)


def save_checkpoint(folder: Path, checkpoint: Checkpoint) -> Path:
    """Atomically replace `folder`/checkpoint.pt with `checkpoint`."""
    path = folder / CHECKPOINT_NAME
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "round": checkpoint.round,
        "plan_digest": checkpoint.plan_digest,
        "state": _state_dict(checkpoint.state),
        "evaluation": json.dumps(checkpoint.evaluation) if checkpoint.evaluation is not None else "",
        "encoder": json.dumps(checkpoint.encoder, sort_keys=True) if checkpoint.encoder is not None else "",
        "plan": canonical_json(checkpoint.plan).decode() if checkpoint.plan is not None else "",
    }
    atomic_write(path, lambda stream: _write_digested(stream, payload, _writer(checkpoint.state)))
    return path


class _DigestingWriter:
    """A write-only stream that hashes what passes through it on its way to the file.

    torch.save hands it each tensor's storage as a view, so the serialised state never exists in memory
    whole: serialised into a buffer first, it was as large as the server state itself, held beside it.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.digest = hashlib.sha256()

        self.written = 0
        """Bytes written: its position, for a zip writer (which, finding no seek, writes front to back)."""

    def write(self, data: bytes | memoryview) -> int:
        self.digest.update(data)
        self.written += memoryview(data).nbytes
        return self.stream.write(data)

    def tell(self) -> int:
        return self.written

    def flush(self) -> None:
        self.stream.flush()


def _write_digested(
    stream: IO[bytes], payload: Mapping[str, Any], write: Callable[[IO[bytes], Mapping[str, Any]], None]
) -> None:
    """The digest line, then `payload` as `write` writes it (torch.save's format), into a seekable `stream`.

    The line is of fixed length, so a placeholder holds its place while the payload streams past the hash, and
    the digest overwrites it once known (the file is renamed into place only after, by ``atomic_write``).
    """
    placeholder = DIGEST_PREFIX + b"0" * (2 * hashlib.sha256().digest_size) + b"\n"
    stream.write(placeholder)
    writer = _DigestingWriter(stream)
    write(writer, payload)  # type: ignore[arg-type]  # a write-only stream is all either writer needs
    stream.seek(0)
    stream.write(DIGEST_PREFIX + writer.digest.hexdigest().encode() + b"\n")


def _content_start(path: Path) -> int:
    """Where the checkpoint at `path`'s zip begins, once its digest holds (ConfigError otherwise); hashed by chunk.

    A checkpoint from before digests (a bare torch file) begins at 0, with a warning.
    """
    with path.open("rb") as file:
        if file.read(len(ZIP_MAGIC)) == ZIP_MAGIC:
            logger.warning("checkpoint %s predates checkpoint digests: a changed byte in it would go unnoticed", path)
            return 0
        file.seek(0)
        header = file.readline(len(DIGEST_PREFIX) + 2 * hashlib.sha256().digest_size + 1)
        if not header.startswith(DIGEST_PREFIX):
            raise ValueError(f"not a {FORMAT} file (no digest line)")
        digest = hashlib.sha256()
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    if header[len(DIGEST_PREFIX) :] != digest.hexdigest().encode() + b"\n":
        raise ConfigError(
            f"checkpoint {path} does not match its own SHA-256 digest: a byte of it changed after it was "
            f"written (a disk error, or an edit); {RESTORE}"
        )
    return len(header)


def _loaded(path: Path) -> tuple[Any, AggregatorState]:
    """The payload of the checkpoint at `path` once its digest holds, and the state it holds.

    A checkpoint of 64 MiB or more is read a span at a time, its state into a file beside it (:mod:`.spanned`).
    """
    start = _content_start(path)
    if not large(path.stat().st_size - start):
        with path.open("rb") as file:
            file.seek(start)
            payload = torch.load(io.BytesIO(file.read()), map_location="cpu", weights_only=True)
        _check_format(payload)
        raw = payload["state"]
        return payload, _scalars(
            raw,
            theta=raw["theta"].to(torch.float64),
            theta_average=raw["theta_average"].to(torch.float64),
            control=raw["control"].to(torch.float64) if "control" in raw else None,
            velocity=raw["velocity"].to(torch.float64) if "velocity" in raw else None,
        )
    with path.open("rb") as file:
        payload, archive, records = read_spanned(file)
        _check_format(payload)
        raw = payload["state"]
        placeholder = torch.empty(0)
        outline = _scalars(
            raw,
            theta=placeholder,
            theta_average=placeholder,
            control=placeholder if "control" in raw else None,
            velocity=placeholder if "velocity" in raw else None,
        )
        return payload, state_in_file(outline, raw, archive, records, path.parent)


def _check_format(payload: Any) -> None:
    if not isinstance(payload, Mapping) or payload.get("format") != FORMAT or payload.get("version") != VERSION:
        raise ValueError(f"not a {FORMAT} version {VERSION} file")


def _scalars(raw: Mapping[str, Any], **tensors: torch.Tensor | None) -> ServerState:
    """The checkpoint's state: its scalars, range-checked, with `tensors` (theta, theta_average, ...)."""
    state = ServerState(
        round=_count(raw["round"], "state.round"),
        c=float(raw["c"]),
        c_average=float(raw["c_average"]),
        averaged_rounds=_count(raw["averaged_rounds"], "state.averaged_rounds"),
        **tensors,  # type: ignore[arg-type]  # theta and theta_average are always given
    )
    if not all(map(math.isfinite, (state.c, state.c_average))):
        raise ValueError(f"fields state.c and state.c_average must be finite, got {state.c}, {state.c_average}")
    return state


def _json_field(payload: Mapping[str, Any], key: str, path: Path) -> Any:
    """A checkpoint's JSON field (None when empty), within :func:`parse_json`'s bounds."""
    text = payload.get(key)
    if not text:
        return None
    return parse_json(str(text).encode(), f"checkpoint {path}, field {key}", RESTORE)


def _count(value: Any, field: str) -> int:
    """A round or a count as read from a checkpoint: an integer in [0, 2^31)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise ValueError(f"field {field} must be a count in [0, 2^31), got {str(value)[:40]}")
    return value


def load_checkpoint(folder: Path, plan_digest: str, plan: Mapping[str, Any] | None = None) -> Checkpoint:
    """The checkpoint in `folder`, refused unless it was written under the plan with `plan_digest`.

    Given the plan's content (:func:`plan_content`), the refusal names every setting that differs.
    """
    path = folder / CHECKPOINT_NAME
    if not path.exists():
        raise ConfigError(f"no checkpoint at {path} to resume from; start without --resume")
    try:
        payload, state = _loaded(path)
        finished_round, digest = _count(payload["round"], "round"), str(payload["plan_digest"])
        evaluation = _json_field(payload, "evaluation", path)
        encoder = _json_field(payload, "encoder", path)
        kept = _json_field(payload, "plan", path)
    except ConfigError:
        raise
    except (
        OSError,
        EOFError,
        RuntimeError,
        ValueError,
        KeyError,
        IndexError,
        TypeError,
        AttributeError,
        OverflowError,
        pickle.UnpicklingError,
        zipfile.BadZipFile,
    ) as error:
        raise ConfigError(f"checkpoint {path} is unreadable ({error}); {RESTORE}") from None
    if digest != plan_digest:
        raise ConfigError(
            f"checkpoint {path} was written under another plan (digest {digest[:12]}..., this plan "
            f"{plan_digest[:12]}...; {_plan_changes(kept, plan)}); resume with the plan it was made with "
            "(command-line overrides such as --rounds or --collaborators are part of the plan: give the same "
            "ones as at the first start), or use another output folder"
        )
    return Checkpoint(finished_round, state, digest, evaluation, encoder, kept)


def _plan_changes(kept: Mapping[str, Any] | None, plan: Mapping[str, Any] | None) -> str:
    """What differs between the checkpoint's plan and this start's (plan file and flags), for the refusal."""
    if kept is None:
        return (
            "this checkpoint keeps only the plan's digest, so the settings that differ cannot be named; "
            "checkpoints written from now on keep the plan itself"
        )
    if plan is None:
        return "the plan's content was not given to compare"
    differences = setting_differences(kept, plan)
    shown = "; ".join(differences[:12]) + (f"; and {len(differences) - 12} more" if len(differences) > 12 else "")
    return f"checkpoint -> now: {shown}"


NON_FINITE = "non_finite"
"""A round record's field naming the values that were not finite numbers and were written as null."""


def append_round_log(folder: Path, record: dict[str, Any]) -> None:
    """Append one JSON line to `folder`/rounds.jsonl and fsync it (the log survives a crash too).

    Strict JSON holds no NaN or infinity, so every such float in `record` (a noised mean or a timing that
    overflowed) becomes null, in `record` itself: the checkpoint, the bundle and the final model written from the
    same dicts after it hold what the log holds, and none of them dies on it. Their paths ("evaluation.mean_risk
    (nan)") go under :data:`NON_FINITE` and into a warning; an evaluation with such a figure is recorded aborted,
    its reason naming them (no reader takes a null for an estimate). The round and the federation go on.
    """
    found: list[str] = []
    null_non_finite(record, found)
    if found:
        record[NON_FINITE] = found
        logger.warning("round %s: not finite, written as null: %s", record.get("round"), ", ".join(found))
    evaluation = record.get("evaluation")
    figures = [path for path in found if path.startswith("evaluation.")]
    if figures and isinstance(evaluation, dict) and evaluation.get("status") == "done":
        # A figure that is no number is no estimate: every reader of a done evaluation reads its figures.
        evaluation.update(status="aborted", reason=f"figures not finite, written as null: {', '.join(figures)}")
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ROUND_LOG_NAME).open("a", encoding="utf-8") as stream:
        stream.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
        stream.flush()
        os.fsync(stream.fileno())


def read_round_log(folder: Path) -> list[dict[str, Any]]:
    """Every record of `folder`/rounds.jsonl, oldest first (empty if there is none)."""
    path = folder / ROUND_LOG_NAME
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def trim_round_log(folder: Path, last_round: int) -> int:
    """Drop the records of rounds after `last_round` from `folder`/rounds.jsonl (atomically).

    Return how many were dropped.

    A round's record is appended just before its checkpoint, so an aggregator killed
    between the two leaves a record of a round that its checkpoint does not hold; the
    resumed process runs that round again and logs it again. Trimming on resume keeps
    one record per round, each describing the run the model actually came from. A
    line that does not parse (an append torn by a power cut) is dropped too.
    """
    path = folder / ROUND_LOG_NAME
    if not path.exists():
        return 0
    kept: list[str] = []
    dropped = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            round_number = int(json.loads(line)["round"])
        except (ValueError, KeyError, TypeError):
            dropped += 1
            continue
        if round_number <= last_round:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        text = "".join(line + "\n" for line in kept).encode()
        atomic_write(path, lambda stream: stream.write(text))
    return dropped


def excluded_in(records: list[dict[str, Any]]) -> dict[str, str]:
    """The collaborators a run has excluded and not re-admitted, from its round log, in order.

    Each record's exclusions (its training round's, then its evaluation's) apply first, then
    its ``readmitted`` names: those ``aggregator start --resume --readmit NAME`` let back in
    after that round (see :func:`fedfair.cli.aggregator.readmit`). So a later
    resume keeps a lifted exclusion lifted, and a collaborator excluded again after its
    re-admission is excluded again.
    """
    excluded: dict[str, str] = {}
    for record in records:
        for source in (record, record.get("evaluation") or {}):
            excluded.update(source.get("excluded") or {})
        for name in record.get("readmitted") or ():
            excluded.pop(name, None)
    return excluded


def export_final_model(folder: Path, checkpoint: Checkpoint, summary: Mapping[str, Any]) -> Path:
    """Write the output model.

    Theta-bar and c-bar (the algorithm's output), the last theta and c, the plan digest and the metrics, as
    final_model.pt (tensors) and final_model.json (the rest).
    """
    state, saved = checkpoint.state, _state_dict(checkpoint.state)
    tensors = {
        "theta_average": saved["theta_average"],
        "c_average": saved["c_average"],
        "theta": saved["theta"],
        "c": saved["c"],
        "plan_digest": checkpoint.plan_digest,
        "rounds": checkpoint.round,
    }
    atomic_write(folder / FINAL_MODEL_NAME, lambda stream: _writer(state)(stream, tensors))
    document = {
        "plan_digest": checkpoint.plan_digest,
        "rounds": checkpoint.round,
        "applied_rounds": saved["round"],
        "c_average": saved["c_average"],
        "c": saved["c"],
        "parameters": parameters(state),
        "model_sha256": state_digest(state),
        **summary,
    }
    text = json.dumps(document, indent=2, sort_keys=True, allow_nan=False).encode()
    atomic_write(folder / FINAL_SUMMARY_NAME, lambda stream: stream.write(text))
    return folder / FINAL_MODEL_NAME
