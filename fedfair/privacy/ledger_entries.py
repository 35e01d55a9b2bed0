"""What a privacy ledger's entries may hold, and what charged entries compose to.

Every value of an entry is range-checked as it is loaded or charged (:mod:`fedfair.privacy.ledger`), so an
edited entry is refused naming its key; :func:`composed` turns charged entries into epsilon by RDP.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence

from fedfair.core.files import MAX_JSON_INTEGER
from fedfair.pki.names import FEDERATION_ID_RE
from fedfair.privacy import distributed

CHARGED_KINDS = ("statistics", "train", "evaluate")
"""The kinds of noised input a ledger charges (a collaborator's record has the same kinds)."""

CHARGED_MECHANISMS = ("skellam",)
"""The mechanisms an entry charges: a site's DP-SGD steps stay in its accountant, composed with them (:func:`composed`)."""

RESET = "reset"
"""The kind of the entry an operator's reset appends: what was spent before it no longer counts."""

MAX_MU = 2.0**64
"""The largest Skellam mu an entry may hold: calibration never goes past 2^60, and noise of a
larger variance would wrap the widest (64-bit) secure sum."""

MAX_TEXT = 256
"""The longest model digest, federation id or reset reason an entry may hold."""

CHARGE_KEYS = frozenset(
    ("kind", "federation", "round", "model", "mechanism", "mu", "l1", "l2", "sampling_rate", "addon", "delta", "prev")
)
OPTIONAL_KEYS = frozenset(("prev", "rounding"))
"""Keys a charge may lack: the chain's link before it is appended, and the rounding a release averages over (only
when charged in expectation, :attr:`fedfair.privacy.distributed.Release.rounding`)."""
RESET_KEYS = frozenset(("kind", "reason", "at", "spent", "prev"))
RESET_OPTIONAL_KEYS = frozenset(("shared",))
"""A reset may name the other ledgers of the same people it ends the spend of: their lineage and how many entries
each held then (:mod:`fedfair.privacy.ledger_people`); what they charge later counts again."""

Entry = dict[str, object]


def _release(entry: Mapping[str, object], steps: int = 1) -> distributed.Release:
    """A ledger entry as the release it charged (`steps` times)."""
    return distributed.Release(
        str(entry["mechanism"]),
        float(entry["mu"]),  # type: ignore[arg-type]
        float(entry["l1"]),  # type: ignore[arg-type]
        float(entry["l2"]),  # type: ignore[arg-type]
        float(entry["sampling_rate"]),  # type: ignore[arg-type]
        steps,
        rounding=int(entry.get("rounding", 0)),  # type: ignore[call-overload]
    )


def composed(entries: list[Entry], delta: float, others: Sequence[distributed.Release] = ()) -> float:
    """The epsilon at `delta` of charged `entries`, and of `others` (DP-SGD steps), composed by RDP (0 for none).

    Identical releases (every training round of a run) are one release of as many steps, so a long ledger
    composes in one pass per kind; every entry's `addon` (rounding and wraps) comes off the delta.
    """
    if not entries and not others:
        return 0.0
    groups: dict[tuple[object, ...], tuple[Entry, int]] = {}
    for entry in entries:
        key = (entry["mechanism"], entry["mu"], entry["l1"], entry["l2"], entry["sampling_rate"], entry.get("rounding"))
        first, steps = groups.get(key, (entry, 0))
        groups[key] = (first, steps + 1)
    releases = [*(_release(first, steps) for first, steps in groups.values()), *others]
    addon = math.fsum(float(entry["addon"]) for entry in entries)  # type: ignore[arg-type]
    return distributed.epsilon(releases, delta - addon)


def spent_on(entries: list[Entry]) -> str:
    """'3 train answers in fed-a, 1 evaluate answers in fed-b', or 'nothing'."""
    counted: dict[tuple[str, str], int] = {}
    for entry in entries:
        key = (str(entry["kind"]), str(entry["federation"]))
        counted[key] = counted.get(key, 0) + 1
    return ", ".join(f"{n} {kind} answers in {federation}" for (kind, federation), n in sorted(counted.items()))


def keys_problem(entry: Mapping[str, object], expected: frozenset[str]) -> str:
    """What keys `entry` lacks and has beyond `expected`, e.g. 'missing mu; unknown nu'."""
    missing, extra = sorted(expected - set(entry)), sorted(set(entry) - expected)
    said = [f"missing {', '.join(missing)}"] * bool(missing) + [f"unknown {', '.join(extra)}"] * bool(extra)
    return "; ".join(said)


def _number(entry: Mapping[str, object], key: str, low: float, high: float, *, open_low: bool = False) -> float:
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key} = {value!r} is not a finite number")
    if value < low or value > high or (open_low and value == low):
        raise ValueError(f"{key} = {value!r} is outside {'(' if open_low else '['}{low:g}, {high:g}]")
    return float(value)


def _text(entry: Mapping[str, object], key: str) -> str:
    value = entry[key]
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise ValueError(f"{key} = {value!r} is not a text of 1 to {MAX_TEXT} characters")
    return value


def check_charge(entry: Mapping[str, object]) -> None:
    """Every key of a charged release present and in range; raises ValueError naming the first that is not."""
    present = OPTIONAL_KEYS & set(entry)
    if set(entry) - present != CHARGE_KEYS - OPTIONAL_KEYS:
        raise ValueError(keys_problem(entry, CHARGE_KEYS - OPTIONAL_KEYS | present))
    if entry["kind"] not in CHARGED_KINDS:
        raise ValueError(f"kind = {entry['kind']!r} is not one of {', '.join((*CHARGED_KINDS, RESET))}")
    if not FEDERATION_ID_RE.fullmatch(_text(entry, "federation")):
        raise ValueError(f"federation = {entry['federation']!r} is not a federation id")
    round_number = entry["round"]
    if isinstance(round_number, bool) or not isinstance(round_number, int) or not 0 <= round_number <= MAX_JSON_INTEGER:
        raise ValueError(f"round = {round_number!r} is not a round number")
    _text(entry, "model")
    if entry["mechanism"] not in CHARGED_MECHANISMS:
        raise ValueError(f"mechanism = {entry['mechanism']!r} is not one of {', '.join(CHARGED_MECHANISMS)}")
    _number(entry, "mu", 0.0, MAX_MU, open_low=True)
    _number(entry, "l1", 0.0, math.inf)
    _number(entry, "l2", 0.0, math.inf)
    _number(entry, "sampling_rate", 0.0, 1.0, open_low=True)
    rounding = entry.get("rounding", 1)
    if isinstance(rounding, bool) or not isinstance(rounding, int) or not 1 <= rounding <= MAX_JSON_INTEGER:
        raise ValueError(f"rounding = {rounding!r} is not a count of coordinates")
    delta = _number(entry, "delta", 0.0, 1.0, open_low=True)
    if delta == 1.0:
        raise ValueError("delta = 1 is not below 1")
    addon = _number(entry, "addon", 0.0, 1.0)
    if addon >= delta:
        raise ValueError(f"addon = {addon!r} is not below delta = {delta!r}")


def check_reset(entry: Mapping[str, object]) -> None:
    """A reset entry: its reason, its time and the spend it ended; raises ValueError naming what is wrong."""
    expected = RESET_KEYS | (RESET_OPTIONAL_KEYS & set(entry))
    if set(entry) != expected:
        raise ValueError(keys_problem(entry, expected))
    shared = entry.get("shared", {})
    counts = shared.values() if isinstance(shared, dict) else [None]
    if not all(
        isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= MAX_JSON_INTEGER for count in counts
    ):
        raise ValueError(f"shared = {shared!r} is not an object of ledger lineage: entry count")
    _text(entry, "reason")
    try:
        dt.datetime.fromisoformat(_text(entry, "at"))
    except ValueError:
        raise ValueError(f"at = {entry['at']!r} is not an ISO time") from None
    _number(entry, "spent", 0.0, math.inf)
