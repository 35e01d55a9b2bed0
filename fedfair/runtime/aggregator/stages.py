"""What a stage of a round is, as the board holds it and its callers see it.

The open stage's record, the handler that absorbs an upload (whatever it raises refuses that upload), when each
peer answered and the grace that bounds a laggard (:class:`StageTiming`) in a stage and in a round
(:class:`RoundGrace`), and the progress the operator is shown while a stage waits.

A stage is settled when the protocol says it has what it needs (``ready``), or when no expected peer is owed an
answer: one is owed nothing once it uploaded, withdrew, or was refused with no upload in progress, nor once it is gone
for the rest of the round (no task stream, or none for a moment this round), but at a stage its kind declares
rejoinable (:attr:`~fedfair.secagg.round.StageSpec.rejoinable`), where a collaborator gone is owed until the deadline.

Why: docs/design.md, "Inside the aggregator".
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from fedfair.runtime.transport import Pieces, pb

SUMMARY_CHARACTERS = 160
"""How much of an error's text a one-line summary keeps (ASN.1 parse errors run to kilobytes)."""


UploadHandler = Callable[[str, bytes], None]
"""handler(peer, payload): absorb one upload or raise. Whatever it raises refuses that upload."""

StageReady = Callable[[], bool]
"""ready(): whether the stage already has what it needs, so it may settle before every peer answered."""


def error_summary(error: BaseException) -> str:
    """'ClassName(REASON): first line of the message' cut to a bounded length: for one-line logs.

    ``(REASON)`` is the error's ``reason`` enum where it has one (e.g. ``RefusedError(INVALID_UPLOAD)``),
    so one class with many causes still says which in the log.
    """
    text = str(error).strip().splitlines()
    reason = text[0] if text else ""
    if len(reason) > SUMMARY_CHARACTERS:
        reason = reason[: SUMMARY_CHARACTERS - 3] + "..."
    cause = getattr(error, "reason", None)
    name = type(error).__name__ + (f"({cause.name})" if isinstance(cause, enum.Enum) else "")
    return f"{name}: {reason}" if reason else name


@dataclass(frozen=True)
class StageProgress:
    """Where an open stage stands: for the operator's periodic progress line."""

    binding: pb.Binding
    answered: int
    expected: int
    waiting_for: tuple[str, ...]
    seconds_left: float


HELD_UP_SECONDS = 1.0
"""A round that waited this long or longer for a site past its stages' median answers names it (log, round log,
report): below it the wait is noise, not a site holding the others up."""

GRACE_FLOOR_SECONDS = 2.0
"""The shortest wait a grace allows past a stage's opening, whatever k x its median answer time: key stages
are answered within milliseconds, and a site a scheduler paused for a moment is not a laggard."""


@dataclass
class StageTiming:
    """When each peer answered one stage (seconds after it opened), and the deadline a grace sets.

    With `grace` = k, once half the `expected` peers have answered the stage waits no longer than
    max(k x the median answer time, GRACE_FLOOR_SECONDS) after it opened: the median is the answer time of
    the ceil(n / 2)-th peer, known as soon as it answers, whatever the others do. Without one (None) only
    the stage's timeout bounds it.

    The grace bounds the round too (:class:`RoundGrace`): `spent` holds how long the round's earlier stages
    already waited for each peer past their medians, and `round_window` the largest of their windows (a
    grace less its median). The stage then waits past its own median no longer than its own window, nor
    than the larger of the two windows less what the peer still owed an answer that has spent least already
    cost.
    """

    expected: int
    grace: float | None = None
    opened: float = 0.0
    closed: float | None = None
    answers: dict[str, float] = field(default_factory=dict)
    spent: Mapping[str, float] = field(default_factory=dict)
    round_window: float = 0.0

    def window(self) -> float | None:
        """How long past its median the stage's own grace waits; None without a grace or before the median."""
        median = self.median()
        if self.grace is None or median is None:
            return None
        return max(self.grace * median, GRACE_FLOOR_SECONDS) - median

    def answered(self, peer: str, now: float) -> None:
        """`peer` answered (uploaded, withdrew or was refused) at `now`; its first answer counts."""
        self.answers.setdefault(peer, now - self.opened)

    def median(self) -> float | None:
        """The answer time of the ceil(n / 2)-th peer, once that many have answered."""
        half = (self.expected + 1) // 2
        return sorted(self.answers.values())[half - 1] if half and len(self.answers) >= half else None

    def grace_deadline(self) -> float:
        """When the grace ends (on the stage's clock); infinite without a grace or before the median is known.

        The stage's own grace, or earlier the round's: what is left of it to the owed peer that has spent least.
        """
        median, window = self.median(), self.window()
        if median is None or window is None:
            return math.inf
        owed = [seconds for peer, seconds in self.spent.items() if peer not in self.answers]
        if owed:
            window = min(window, max(window, self.round_window) - min(owed))
        return self.opened + median + window

    def round_ended(self) -> bool:
        """Whether the round's grace, not the stage's own, set :meth:`grace_deadline`."""
        median, window = self.median(), self.window()
        return median is not None and window is not None and self.grace_deadline() < self.opened + median + window

    def held_up(self, expected: Iterable[str]) -> dict[str, float]:
        """How long the stage waited for each of `expected` past its median answer.

        The seconds between the median and the peer's answer (the stage's close, if it never answered); only
        peers that came later.
        """
        median = self.median()
        if median is None or self.closed is None:
            return {}
        end = self.closed - self.opened
        waits = {peer: self.answers.get(peer, end) - median for peer in expected}
        return {peer: wait for peer, wait in waits.items() if wait > 0}

    def past_grace(self, stage: str, expected: Iterable[str]) -> str | None:
        """Why the closed stage `stage` went on without some of `expected`, if its grace ended it.

        Returns a line naming the late peers, or None when every peer answered or the timeout (not the grace)
        ended the stage.
        """
        late = sorted(set(expected) - self.answers.keys())
        median = self.median()
        if not late or median is None or self.grace is None or self.closed is None:
            return None
        if self.grace_deadline() > self.closed:
            return None
        if self.round_ended():
            spent = min((self.spent[peer] for peer in late if peer in self.spent), default=0.0)
            return (
                f"{', '.join(late)} did not answer {stage} within what the round's grace left "
                f"({self.grace_deadline() - self.opened - median:.1f} s past the median answer time {median:.2f} s; "
                f"earlier stages of the round already waited {spent:.1f} s for them, of "
                f"{max(self.round_window, self.window() or 0.0):.1f} s, [quorum] grace_factor)"
            )
        return (
            f"{', '.join(late)} did not answer {stage} within the grace of {self.grace:g} x the median answer "
            f"time {median:.2f} s ({self.grace_deadline() - self.opened:.1f} s, [quorum] grace_factor)"
        )


@dataclass
class RoundGrace:
    """The grace of one round: how long its stages together wait for each peer past their median answers.

    A stage's grace alone lets a peer answer each stage just before it, so a peer 1.5 s late in each of a
    round's stages (all within the 2 s floor) made the round 8 s instead of 0.04 s. Here every stage's wait
    for a peer past the stage's median answer is summed over the round (training and evaluation both), and a
    stage waits no longer for a peer than the largest grace window of the round's stages (k x the median
    answer, at least the floor, less the median) less what the peer already cost: so one late peer adds to
    a round at most one grace, however many stages it has.
    """

    round: int
    grace: float | None
    window: float = 0.0
    """The largest of the round's stages' grace windows past their medians, so far."""
    spent: dict[str, float] = field(default_factory=dict)
    """How long the round's stages so far waited for each peer past their medians."""

    def timing(self, expected: Iterable[str]) -> StageTiming:
        """The timing of the round's next stage, for `expected` peers, bounded by what the round has left."""
        peers = frozenset(expected)
        spent = {peer: self.spent.get(peer, 0.0) for peer in peers}
        return StageTiming(len(peers), self.grace, spent=spent, round_window=self.window)

    def closed(self, timing: StageTiming, expected: Iterable[str]) -> dict[str, float]:
        """Count the closed stage `timing`'s waits; return them (:meth:`StageTiming.held_up`)."""
        held_up = timing.held_up(expected)
        for peer, seconds in held_up.items():
            self.spent[peer] = self.spent.get(peer, 0.0) + seconds
        self.window = max(self.window, timing.window() or 0.0)
        return held_up


@dataclass
class OpenStage:
    """The one stage open for uploads: who is expected, what each may fetch, and who has answered how, when.

    Its `deadline` is the earlier of its timeout and its timing's grace (:class:`StageTiming`).
    """

    binding: pb.Binding
    expected: frozenset[str]
    inputs: bytes | Mapping[str, bytes | Pieces]
    handler: UploadHandler
    max_upload_bytes: int
    timeout_at: float
    ready: StageReady | None
    timing: StageTiming
    rejoinable: bool = False
    """Whether a collaborator whose task stream ended may take the stage on a new one (:attr:`~fedfair.secagg.round.StageSpec.rejoinable`)."""
    accepted: set[str] = field(default_factory=set)
    withdrawn: set[str] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)
    received_bytes: int = 0

    @property
    def deadline(self) -> float:
        """When the stage closes, on the board's clock: the earlier of its timeout and its grace deadline."""
        return min(self.timeout_at, self.timing.grace_deadline())


def input_for(inputs: bytes | Mapping[str, bytes | Pieces], peer: str) -> bytes | Pieces:
    """What `peer` may fetch of a stage's input: the one input every peer shares, or its own (whole, or in pieces)."""
    return inputs if isinstance(inputs, bytes) else inputs.get(peer, b"")
