"""What a stage of a round is, as the board holds it and its callers see it: the open stage's
record, the handler that absorbs an upload (whatever it raises refuses that upload), and the
progress the operator is shown while a stage waits.

A stage is settled when the protocol says it has what it needs (the optional
``ready`` predicate of :meth:`~fedfair.runtime.aggregator.board.Board.open_stage`), or when
no expected peer is still owed an answer. A peer is owed nothing once it has

- uploaded (the handler absorbed its upload);
- withdrawn: an upload of zero bytes (its update was not finite, its privacy budget
  is spent, or the round's parameters were not the plan's);
- disconnected: no live task stream, or a stream that ended during this round;
- been refused: the handler raised on its upload, and it has no other upload in
  progress. An honest collaborator whose upload is refused sits out the rest of the
  round, so waiting for it would only run the stage to its deadline. A refusal is
  recorded for the certificate's name that sent the upload, so it settles only the
  sender's own slot: a peer cannot settle anyone else's by sending bad messages
  (one that names another party is refused and charged to its sender). A retry
  that is in progress when the others finish is waited for, and a valid upload
  after a refusal still counts while the stage is open.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fedfair.core.errors import FedfairError
from fedfair.runtime.transport import pb

SUMMARY_CHARACTERS = 160
"""How much of an error's text a one-line summary keeps (ASN.1 parse errors run to kilobytes)."""


class UploadRefused(FedfairError):
    """An upload reached the open stage but its content is invalid (the handler refused it)."""


UploadHandler = Callable[[str, bytes], None]
"""handler(peer, payload): absorb one upload or raise. Whatever it raises refuses that upload."""

StageReady = Callable[[], bool]
"""ready(): whether the stage already has what it needs, so it may settle before every peer answered."""

def error_summary(error: BaseException) -> str:
    """'ClassName: first line of the message' cut to a bounded length: for one-line logs."""
    text = str(error).strip().splitlines()
    reason = text[0] if text else ""
    if len(reason) > SUMMARY_CHARACTERS:
        reason = reason[: SUMMARY_CHARACTERS - 3] + "..."
    return f"{type(error).__name__}: {reason}" if reason else type(error).__name__


@dataclass(frozen=True)
class StageProgress:
    """Where an open stage stands: for the operator's periodic progress line."""

    binding: pb.Binding
    answered: int
    expected: int
    waiting_for: tuple[str, ...]
    seconds_left: float


@dataclass
class OpenStage:
    """The one stage open for uploads: who is expected, what each may fetch, and who has answered how."""

    binding: pb.Binding
    expected: frozenset[str]
    inputs: bytes | Mapping[str, bytes]
    handler: UploadHandler
    max_upload_bytes: int
    deadline: float
    ready: StageReady | None
    accepted: set[str] = field(default_factory=set)
    withdrawn: set[str] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)
    received_bytes: int = 0


def input_for(inputs: bytes | Mapping[str, bytes], peer: str) -> bytes:
    """What `peer` may fetch of a stage's input: the one input every peer shares, or its own."""
    return inputs if isinstance(inputs, bytes) else inputs.get(peer, b"")
