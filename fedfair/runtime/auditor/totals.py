"""The sites each set of inputs was first totalled over, kept in the auditor's folder across its restarts.

A site sends one input per model: a round the aggregator runs again, and a later round on a model a void round
left, carry each site's kept input again (under distributed DP only the same round does: each round's input is
trained afresh). The auditor totals the same inputs over the same sites or not at all
(:meth:`AuditorRounds.step <fedfair.runtime.auditor.kinds.bounded.AuditorRounds.step>`): two totals of them over
different sites could be subtracted. So each first total's sites are written (atomically) before it is uploaded.

The same inputs over the same sites carry the same noise, or two draws could be averaged: each round's noise is
drawn from a key derived from the round's name and a secret kept in the auditor's folder (:class:`NoiseKeys`).
The two are kept together (:func:`kept_state`): a folder holding one without the other lost one, so it is
refused (docs/security.md, "A round run again").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from cryptography.hazmat.primitives import hashes, hmac

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write, kept_secret, read_json

TOTALS_NAME = "totals.json"
"""The file, in the auditor's folder, of every round it totalled and over which sites."""
NOISE_SECRET_NAME = "noise.secret"
"""The file, in the auditor's folder, of the secret every round's noise key is derived from."""
T = TypeVar("T")

_FIX = (
    "it is written by the auditor alone: restore it from a backup; deleting it lets this auditor total a round "
    "run again over other sites, which it exists to prevent"
)


@dataclass(frozen=True)
class TotalledRound:
    """One round the auditor totalled: its federation, number and model digest, and the sites the total covered."""

    federation_id: str
    round: int
    model: str
    sites: frozenset[str]

    def same_inputs(self, other: TotalledRound, *, fresh_each_round: bool) -> bool:
        """Whether `other` totals the same inputs, over whichever sites.

        The same federation and model (a round run again, or a later round on the model a void round left), and with
        `fresh_each_round` (distributed DP: each round's input is trained afresh and charged) the same round too.
        """
        same_model = (self.federation_id, self.model) == (other.federation_id, other.model)
        return same_model and (self.round == other.round or not fresh_each_round)


class FirstTotals:
    """The first total of every set of inputs this auditor totalled, read from and written to `folder`.

    `fresh_each_round`: each round's inputs are its own (distributed DP), so a total is the first of its round;
    otherwise a total is the first on its model (:meth:`TotalledRound.same_inputs`).
    """

    def __init__(self, folder: Path, *, fresh_each_round: bool) -> None:
        self.path = folder / TOTALS_NAME
        self.fresh_each_round = fresh_each_round
        self._totals = _read(self.path) if self.path.exists() else []

    def first(self, total: TotalledRound) -> TotalledRound:
        """The first total of `total`'s inputs; `total` itself when it is the first, then kept before it returns.

        Raises:
            OSError: the file could not be written (the total must then not be uploaded).
        """
        for kept in self._totals:
            if kept.same_inputs(total, fresh_each_round=self.fresh_each_round):
                return kept
        self._totals.append(total)
        self.save()
        return total

    @property
    def empty(self) -> bool:
        """Whether this auditor has totalled nothing yet."""
        return not self._totals

    def save(self) -> None:
        """Write every first total to the folder (atomically; an empty list before the first)."""
        entries = [
            {"federation_id": kept.federation_id, "round": kept.round, "model": kept.model, "sites": sorted(kept.sites)}
            for kept in self._totals
        ]
        atomic_write(self.path, lambda stream: stream.write(json.dumps(entries, indent=1).encode()))


class NoiseKeys:
    """The key each round's noise is drawn from: HMAC-SHA256 of the auditor's secret over the round's name.

    A round run again (its federation, number and model) gets the same key, so its total carries the same noise. The
    secret is drawn once from the OS's CSPRNG and kept in `folder` (0600, as every file the auditor writes), so a
    restarted auditor derives the same keys; nobody else holds it, so nobody else can tell the noise.
    """

    def __init__(self, folder: Path) -> None:
        """Read the secret in `folder`, or make it (ConfigError when the file is not one)."""
        self._secret = kept_secret(
            folder / NOISE_SECRET_NAME,
            "it is written by the auditor alone: restore it from a backup; deleting it lets a round run again carry "
            "other noise than its first total's",
        )

    def key(self, federation_id: str, round_number: int, model: str) -> bytes:
        """The 32-byte key of the noise of round `round_number` of `federation_id` on the model `model`."""
        mac = hmac.HMAC(self._secret, hashes.SHA256())
        mac.update(json.dumps([federation_id, round_number, model]).encode())
        return mac.finalize()


def check_kept_state(folder: Path) -> None:
    """Refuse a `folder` holding one of ``totals.json`` and ``noise.secret`` without the other.

    Local, so checked before the auditor dials (:class:`~fedfair.runtime.auditor.process.AuditorProcess`): a partial
    restore is named at once, not once an aggregator answers.

    Raises:
        ConfigError: one of them is missing beside the other (a partial restore, or a file deleted): a fresh secret
            would noise a round run again afresh (two draws averaged leave half the noise's variance), and fresh
            totals would let it be totalled over other sites (their difference is one site's input). The message
            names the missing file and the fix.
    """
    totals_path, secret_path = folder / TOTALS_NAME, folder / NOISE_SECRET_NAME
    if secret_path.exists() and not totals_path.exists():
        raise ConfigError(
            f"{totals_path} is missing beside {secret_path}: without it this auditor could total a round run again "
            f"over other sites, whose difference is one site's input; restore the folder's {TOTALS_NAME} from a "
            "backup, or give a new federation a new auditor folder"
        )
    if totals_path.exists() and _read(totals_path) and not secret_path.exists():
        raise ConfigError(
            f"{secret_path} is missing beside {totals_path}, which records totals this auditor made: a new secret "
            "would noise a round run again afresh, and two draws of its noise averaged leave half its variance; "
            f"restore the folder's {NOISE_SECRET_NAME} from a backup, or give a new federation a new auditor folder"
        )


def kept_state(folder: Path, *, fresh_each_round: bool) -> tuple[FirstTotals, NoiseKeys]:
    """The auditor's first totals and noise keys in `folder`, made together there when neither is.

    A folder's first start writes an empty ``totals.json`` and then ``noise.secret``, so from then on both are there.

    Raises:
        ConfigError: one of them is missing beside the other (:func:`check_kept_state`).
    """
    check_kept_state(folder)
    totals = FirstTotals(folder, fresh_each_round=fresh_each_round)
    if not totals.path.exists():
        totals.save()
    return totals, NoiseKeys(folder)


def _read(path: Path) -> list[TotalledRound]:
    """The totals kept in `path` (ConfigError naming it and the fix when it is not what this module writes)."""
    entries = read_json(path, _FIX)
    try:
        return [
            TotalledRound(
                _typed(entry["federation_id"], str),
                _typed(entry["round"], int),
                _typed(entry["model"], str),
                frozenset(_typed(site, str) for site in _typed(entry["sites"], list)),
            )
            for entry in _typed(entries, list)
        ]
    except (KeyError, TypeError) as error:
        raise ConfigError(f"{path}: not a list of totalled rounds ({error}); {_FIX}") from None


def _typed(value: object, kind: type[T]) -> T:
    """`value` when it is a `kind` (TypeError otherwise)."""
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not a {kind.__name__}")
    return value
