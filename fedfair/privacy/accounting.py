"""Privacy accounting: epsilon of a history of DP-SGD runs, noise for a target, a persisted accountant.

Every round's steps join one history (noise, sample rate, steps) per collaborator and dataset,
whichever federation asked, persisted in a JSON state file (:func:`privacy_state_path`,
``NAME.DATA.privacy.json``, beside the data's ledger in the institution's ledger folder) with the
rounds each federation charged and a SHA-256 over its content, so that it survives restarts and a
hand edit is refused; the cumulative (epsilon, delta) comes from a PRV accountant (RDP as a
cross-check). Like the ledger it counts the other accountants of the same people
(:func:`shared_histories`). Files of before, one per federation, are folded in once
(:func:`open_accountant`). Under distributed DP a collaborator's spend is
:class:`DistributedAccountant`'s instead, the same interface over the plan's noise.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.analysis import rdp as rdp_analysis
from opacus.accountants.utils import get_noise_multiplier

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write, read_json
from fedfair.pki.roster import canonical_json
from fedfair.privacy.config import ACCOUNTANTS, PrivacyConfig
from fedfair.privacy.distributed import TrainingNoise
from fedfair.privacy.ledger import data_digest
from fedfair.privacy.ledger_people import groups, overlaps

RDP_ORDERS = tuple(RDPAccountant.DEFAULT_ALPHAS)
STATE_FORMAT = "fedfair-privacy-accountant"
STATE_VERSION = 3
"""Version 3 is one site's and dataset's: the data, each federation's rounds, the history and a digest over
them. Version 2 (one federation's, recording its id) and version 1 files are folded into it once."""

_STATE_KEYS = frozenset(("format", "version", "data", "rounds", "history", "sha256"))

UNRECORDED = "(unrecorded)"
"""The federation a ``NAME.privacy.json`` of before per-federation accounting is folded in under."""

History = list[tuple[float, float, int]]
"""(noise multiplier, sample rate, steps) runs, consecutive equal settings merged."""


# ---------------------------------------------------------------- accounting


def noise_multiplier_for(privacy: PrivacyConfig, sample_rate: float, planned_steps: int | None) -> float:
    """sigma: the given one, or the one that spends `target_epsilon` over the planned steps."""
    if privacy.noise_multiplier is not None:
        return privacy.noise_multiplier
    if privacy.target_epsilon is None:
        raise ConfigError("privacy has no noise level; set noise_multiplier or target_epsilon")
    if planned_steps is None:
        raise ConfigError(
            "target_epsilon needs the number of rounds to spread it over (the plan's rounds); "
            "pass planned_rounds or give noise_multiplier instead"
        )
    return plan_noise_multiplier(privacy.target_epsilon, privacy.delta, sample_rate, planned_steps, privacy.accountant)


def _validated_run(noise_multiplier: float, sample_rate: float, steps: int) -> tuple[float, float, int]:
    if not noise_multiplier >= 0.0 or not math.isfinite(noise_multiplier):
        raise ConfigError(
            f"noise multiplier must be a number >= 0, got {noise_multiplier}; e.g. --noise-multiplier 1.0"
        )
    if not 0.0 < sample_rate <= 1.0:
        raise ConfigError(
            f"sample rate must be in (0, 1], got {sample_rate}; it is batch size / dataset size, e.g. --sample-rate 0.01"
        )
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps must be a positive integer, got {steps}; e.g. --steps 1000")
    return float(noise_multiplier), float(sample_rate), steps


def _check_accountant(accountant: str) -> None:
    if accountant not in ACCOUNTANTS:
        raise ConfigError(f"unknown privacy accountant '{accountant}'; choose prv or rdp (--accountant)")


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {delta}; use well below 1/n, e.g. --delta 1e-5")


def epsilon_of_history(history: Sequence[tuple[float, float, int]], delta: float, accountant: str = "prv") -> float:
    """Cumulative epsilon at delta of a DP-SGD history; infinite once any step had no noise."""
    _check_accountant(accountant)
    _check_delta(delta)
    if not history:
        return 0.0
    if any(noise_multiplier == 0.0 for noise_multiplier, _, _ in history):
        return math.inf
    # RDP warns when its best order sits at the edge of its grid (a valid, slightly loose bound);
    # PRV takes log(0) on its way at sample rate 1. Neither is news to the user.
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")
        if accountant == "rdp":
            # Opacus' RDPAccountant computes exactly this; RDP is linear in steps, so caching one
            # step's RDP per setting makes a round's check one conversion instead of ~150 series.
            rdp = sum(steps * _one_step_rdp(noise_multiplier, rate) for noise_multiplier, rate, steps in history)
            return float(rdp_analysis.get_privacy_spent(orders=RDP_ORDERS, rdp=rdp, delta=delta)[0])
        prv = PRVAccountant()
        prv.history = [tuple(run) for run in history]
        return float(prv.get_epsilon(delta=delta))


@lru_cache(maxsize=256)
def _one_step_rdp(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    rdp: np.ndarray = rdp_analysis.compute_rdp(
        q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=RDP_ORDERS
    )
    return rdp


def compute_epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "prv"
) -> float:
    """Epsilon at delta after `steps` DP-SGD steps with Poisson sample rate q and noise multiplier sigma."""
    return epsilon_of_history([_validated_run(noise_multiplier, sample_rate, steps)], delta, accountant)


@lru_cache(maxsize=64)
def plan_noise_multiplier(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "prv"
) -> float:
    """The smallest noise multiplier (to 0.01 in epsilon) whose `steps` steps spend at most target_epsilon."""
    if not target_epsilon > 0.0 or not math.isfinite(target_epsilon):
        raise ConfigError(f"target epsilon must be a positive number, got {target_epsilon}; e.g. --target-epsilon 3")
    _check_accountant(accountant)
    _check_delta(delta)
    _, sample_rate, steps = _validated_run(1.0, sample_rate, steps)
    try:
        with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
            warnings.simplefilter("ignore")
            return float(
                get_noise_multiplier(
                    target_epsilon=target_epsilon,
                    target_delta=delta,
                    sample_rate=sample_rate,
                    steps=steps,
                    accountant=accountant,
                )
            )
    except ValueError:
        raise ConfigError(
            f"no noise multiplier reaches epsilon {target_epsilon} at delta {delta} over {steps} steps at sample rate "
            f"{sample_rate:g}; raise the target epsilon, or lower the rounds or the batch size"
        ) from None


def privacy_state_path(folder: Path, name: str, data: Mapping[str, object]) -> Path:
    """Where collaborator `name` keeps its accountant for the data `data` names: ``folder/NAME.DATA.privacy.json``.

    DATA is the first 16 hex digits of the data's digest (:func:`fedfair.privacy.ledger.data_digest`), as for
    its ledger: what the records lose is counted over every federation that asks.
    """
    return folder / f"{name}.{data_digest(data)[:16]}.privacy.json"


def open_accountant(
    folder: Path, name: str, data: Mapping[str, object], federation: str, *, kept_in: Path | None = None
) -> tuple[PrivacyAccountant, list[str]]:
    """The accountant of `name`'s `data` in `kept_in` (default `folder`), charging for `federation`; what it folded.

    Returns the accountant and the federations folded in now. Each state file of before in `folder`
    (``NAME.FEDERATION.privacy.json``, version 1 or 2, and ``NAME.privacy.json``) is folded in once: its history
    joins the data's and its rounds are kept under its federation.
    """
    state = privacy_state_path(kept_in or folder, name, data)
    accountant = PrivacyAccountant(state, federation=federation, data=data)
    folded = []
    for path in sorted(folder.glob(f"{name}.*privacy.json")):
        stem = path.name.removeprefix(f"{name}.").removesuffix("privacy.json").removesuffix(".")
        if path != accountant.path and accountant.fold(path, stem or UNRECORDED):
            folded.append(stem or UNRECORDED)
    return accountant, folded


class PrivacyAccountant:
    """One collaborator's privacy spend on one dataset: its DP-SGD history over every federation, persisted.

    The history is mechanism-neutral (noise multiplier, sample rate, steps), so the
    same file can be read with either accountant. With a `path` every `spend` is
    written atomically before it returns, so a crash or restart can only
    over-count, never forget, what was spent. The file records the data it is for
    and how many rounds each federation charged (`rounds` is `federation`'s); a file
    of other data, or one whose digest is not of its content, is refused.
    """

    def __init__(
        self, path: Path | None = None, *, federation: str = "", data: Mapping[str, object] | None = None
    ) -> None:
        self.path = path
        self.federation = federation
        self.data = dict(data or {})
        self.history: History = []
        self._rounds: dict[str, int] = {}
        self.shared: Callable[[], list[History]] | None = None
        """What the other accountants of its people spent, one history per group of its rows
        (:func:`shared_histories`), read again at each use; None when its people are not known."""
        if path is not None and path.exists():
            self._load(path)

    @classmethod
    def read(cls, path: Path) -> PrivacyAccountant:
        """The accountant at `path` as it stands, whatever data it is of (another of the same people's).

        Raises:
            ConfigError: the file is damaged or edited, naming it.
        """
        state = read_json(path, "restore it from a backup (starting afresh would forget the privacy already spent)")
        data = state.get("data") if isinstance(state, dict) else None
        return cls(path, data=data if isinstance(data, dict) else {"unreadable": True})

    @property
    def rounds(self) -> int:
        """The rounds this accountant charged for its federation (what that federation's record must not exceed)."""
        return self._rounds.get(self.federation, 0)

    @property
    def rounds_by_federation(self) -> dict[str, int]:
        """The rounds each federation charged, by federation id."""
        return dict(sorted(self._rounds.items()))

    @property
    def steps(self) -> int:
        """DP-SGD steps recorded so far, over every run of the history (every federation's)."""
        return sum(steps for _, _, steps in self.history)

    def epsilon(self, delta: float, accountant: str = "prv", *, then: tuple[float, float, int] | None = None) -> float:
        """Cumulative epsilon at delta so far, or after one more run `then` if given.

        Over every federation and, where its people are known, every other accountant of them (for the row that
        belongs to the most).
        """
        history = _merged(self.history, then) if then is not None else self.history
        shared = self.shared() if self.shared is not None else [[]]
        return max(epsilon_of_history([*others, *history], delta, accountant) for others in shared)

    def spend(self, noise_multiplier: float, sample_rate: float, steps: int) -> None:
        """Record one round's steps (and persist them) before they are taken."""
        self.history = _merged(self.history, _validated_run(noise_multiplier, sample_rate, steps))
        self._rounds[self.federation] = self.rounds + 1
        if self.path is not None:
            self._save(self.path)

    def fold(self, path: Path, federation: str) -> bool:
        """Fold a state file of before (one federation's) into this history, once; whether it was folded now.

        Raises:
            ConfigError: the file is unreadable, or records another federation than its name says.
        """
        if federation in self._rounds:
            return False
        fix = f"restore it from a backup, or move it away if it is not about the data of {self.path}"
        state = read_json(path, fix)
        try:
            if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
                raise ValueError(f"not a {STATE_FORMAT} file")
            version = state.get("version")
            if version == STATE_VERSION:
                return False  # another dataset's accountant, not a file of before
            if version not in (1, 2):
                raise ValueError(f"version {version!r}, not 1, 2 or {STATE_VERSION}")
            if version == 2 and state["federation"] not in (federation, None):
                raise ValueError(f"it records federation {state['federation']!r}, not {federation!r}")
            history = _history(state["history"])
            rounds = _count(state["rounds"], "rounds")
        except (ValueError, TypeError, KeyError, ConfigError) as error:
            raise ConfigError(f"privacy accountant state {path} is unreadable ({error}); {fix}") from None
        for run in history:
            self.history = _merged(self.history, run)
        self._rounds[federation] = rounds
        if self.path is not None:
            self._save(self.path)
        return True

    def _content(self) -> dict[str, object]:
        return {
            "data": self.data,
            "rounds": dict(sorted(self._rounds.items())),
            "history": [list(run) for run in self.history],
        }

    def _save(self, path: Path) -> None:
        content = self._content()
        state = {"format": STATE_FORMAT, "version": STATE_VERSION, **content, "sha256": _digest(content)}
        atomic_write(path, lambda stream: stream.write(json.dumps(state, indent=1).encode()))

    def _load(self, path: Path) -> None:
        fix = "restore it from a backup (starting afresh would forget the privacy already spent)"
        state = read_json(path, fix)  # bounded: a 100,000-deep file or 10**30 steps is one named error
        try:
            if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
                raise ValueError(f"not a {STATE_FORMAT} file")
            if state.get("version") != STATE_VERSION or set(state) != _STATE_KEYS:
                raise ValueError(
                    f"not a version {STATE_VERSION} state with exactly the keys {', '.join(sorted(_STATE_KEYS))}"
                )
            content = {key: state[key] for key in ("data", "rounds", "history")}
            if state["sha256"] != _digest(content):
                raise ValueError("its sha256 is not the digest of its content: the file was edited or damaged")
            history = _history(state["history"])
            rounds = state["rounds"]
            if not isinstance(rounds, dict):
                raise ValueError("rounds is not an object of federation: count")
            counted = {str(federation): _count(count, f"rounds.{federation}") for federation, count in rounds.items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError, ConfigError) as error:
            raise ConfigError(f"privacy accountant state {path} is unreadable ({error}); {fix}") from None
        if state["data"] != self.data:
            raise ConfigError(
                f"privacy accountant state {path} is of the data {state['data']!r}, not {self.data!r}; put back the "
                "file that was at this path"
            )
        self.history, self._rounds = history, counted


def shared_histories(ledger: Path, digests: np.ndarray, key: bytes) -> list[History]:
    """What the other DP-SGD accountants of the same people spent: one history per group of a table's rows.

    `ledger` is the path of the table's ledger in the institution's ledger folder, `digests` and `key` its rows'
    (:func:`fedfair.privacy.ledger_people.keep_rows`); an accountant of another table there counts for the rows
    its table shares (:func:`fedfair.privacy.ledger_people.overlaps`).

    Raises:
        ConfigError: a rows file or an accountant there is damaged or of another key, naming it.
    """
    histories: list[History] = []
    memberships: list[np.ndarray] = []
    for rows, inside in overlaps(ledger, digests, key):
        state = rows.with_name(rows.name.removesuffix(".rows") + ".privacy.json")
        if state.is_file():
            histories.append(PrivacyAccountant.read(state).history)
            memberships.append(inside)
    return [[run for index in sorted(group) for run in histories[index]] for group in groups(memberships)]


def _digest(content: Mapping[str, object]) -> str:
    """SHA-256 (hex) of a state's content in canonical JSON."""
    return hashlib.sha256(canonical_json(dict(content))).hexdigest()


def _history(runs: object) -> History:
    """A state's history, each run checked; a ValueError names the first run out of range."""
    if not isinstance(runs, list):
        raise ValueError("history is not a list of runs")
    history: History = []
    for index, run in enumerate(runs):
        try:
            sigma, rate, steps = run
            history.append(_validated_run(float(sigma), float(rate), steps))
        except (ValueError, TypeError, ConfigError) as error:
            raise ValueError(f"history[{index}]: {error}") from None
    return history


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} must be a count, got {value!r}")
    return value


def _merged(history: History, run: tuple[float, float, int]) -> History:
    """Append a run, folding it into the last one when the settings are equal.

    Merging keeps the history short (PRV's cost grows with its length) and makes R
    rounds of tau steps the very same computation as one run of R * tau steps.
    """
    if history and history[-1][:2] == run[:2]:
        return [*history[:-1], (run[0], run[1], history[-1][2] + run[2])]
    return [*history, run]


class DistributedAccountant:
    """A collaborator's spend under distributed DP: each local step is one release of the plan's noise.

    The same interface as :class:`PrivacyAccountant` (``epsilon``, ``spend``,
    ``rounds``, ``steps``), so the private learner uses either; the noise multiplier it is handed is
    the local one (zero) and is not what is charged. Kept in memory: a persisted ledger is the
    collaborator process's.
    """

    def __init__(self, noise: TrainingNoise) -> None:
        self.noise = noise
        self.rounds = 0
        self.steps = 0

    def epsilon(self, delta: float, accountant: str = "rdp", *, then: tuple[float, float, int] | None = None) -> float:
        """Epsilon at ``delta`` spent so far, or after one more run ``then`` (sigma, q, steps)."""
        return self.noise.epsilon(self.steps + (then[2] if then is not None else 0), delta)

    def spend(self, noise_multiplier: float, sample_rate: float, steps: int) -> None:
        """Charge ``steps`` steps (the plan's noise and this collaborator's sampling rate, fixed when built)."""
        self.steps += steps
        self.rounds += 1
