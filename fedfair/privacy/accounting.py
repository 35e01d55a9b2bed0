"""Privacy accounting: epsilon of a history of DP-SGD runs, noise for a target, a persisted accountant.

Every round's steps join one history (noise, sample rate, steps) per collaborator
and federation, persisted in a JSON state file so that it survives restarts; the
cumulative (epsilon, delta) comes from a PRV accountant (RDP as a cross-check).

The state file is keyed by the federation id (:func:`privacy_state_path`) and
records it: a restart within a federation continues its history, and joining
another federation starts a new one instead of silently carrying a budget spent
elsewhere. The budget is therefore per federation; an institution that trains on
the same records in several federations must add their epsilons up itself.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.analysis import rdp as rdp_analysis
from opacus.accountants.utils import get_noise_multiplier

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write, read_json
from fedfair.privacy.config import ACCOUNTANTS, PrivacyConfig

RDP_ORDERS = tuple(RDPAccountant.DEFAULT_ALPHAS)
STATE_FORMAT = "fedfair-privacy-accountant"
STATE_VERSION = 2
"""Version 2 records the federation id; version 1 files (without it) are still read."""

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


def privacy_state_path(folder: Path, name: str, federation_id: str) -> Path:
    """Where collaborator `name` keeps its accountant for one federation: `folder/NAME.FEDERATION.privacy.json`.

    Keyed by the federation so that a collaborator joining another federation starts a new
    history (its own budget) rather than sitting out every round on a budget spent elsewhere.
    """
    return folder / f"{name}.{federation_id}.privacy.json"


def legacy_privacy_state_path(folder: Path, name: str) -> Path:
    """Where collaborators kept their accountant before it was kept per federation (`NAME.privacy.json`)."""
    return folder / f"{name}.privacy.json"


class PrivacyAccountant:
    """One collaborator's privacy spend over the whole federation: its DP-SGD history, persisted.

    The history is mechanism-neutral (noise multiplier, sample rate, steps), so the
    same file can be read with either accountant. With a `path` every `spend` is
    written atomically before it returns, so a crash or restart can only
    over-count, never forget, what was spent. The file records `federation`, the
    federation id the history belongs to; a file of another federation is refused.
    """

    def __init__(self, path: Path | None = None, *, federation: str | None = None) -> None:
        self.path = path
        self.federation = federation
        self.history: History = []
        self.rounds = 0
        if path is not None and path.exists():
            self._load(path)

    @property
    def steps(self) -> int:
        """DP-SGD steps recorded so far, over every run of the history."""
        return sum(steps for _, _, steps in self.history)

    def epsilon(self, delta: float, accountant: str = "prv", *, then: tuple[float, float, int] | None = None) -> float:
        """Cumulative epsilon at delta so far, or after one more run `then` if given."""
        history = _merged(self.history, then) if then is not None else self.history
        return epsilon_of_history(history, delta, accountant)

    def spend(self, noise_multiplier: float, sample_rate: float, steps: int) -> None:
        """Record one round's steps (and persist them) before they are taken."""
        self.history = _merged(self.history, _validated_run(noise_multiplier, sample_rate, steps))
        self.rounds += 1
        if self.path is not None:
            self._save(self.path)

    def _save(self, path: Path) -> None:
        state = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "federation": self.federation,
            "rounds": self.rounds,
            "history": [list(run) for run in self.history],
        }
        atomic_write(path, lambda stream: stream.write(json.dumps(state, indent=1).encode()))

    def _load(self, path: Path) -> None:
        fix = "restore it from a backup (starting afresh would forget the privacy already spent)"
        state = read_json(path, fix)  # bounded: a 100,000-deep file or 10**30 steps is one named error
        try:
            version = state.get("version")
            if state.get("format") != STATE_FORMAT or version not in (1, STATE_VERSION):
                raise ValueError(f"not a {STATE_FORMAT} version 1 or {STATE_VERSION} file")
            history = [_validated_run(float(sigma), float(rate), steps) for sigma, rate, steps in state["history"]]
            rounds = state["rounds"]
            if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
                raise ValueError(f"rounds must be a count, got {rounds!r}")
            # Version 1 did not record the federation: one that sits at this federation's path was put
            # there on purpose (by its operator, renaming it) and is this federation's.
            federation = state["federation"] if version == STATE_VERSION else self.federation
            if federation is not None and not isinstance(federation, str):
                raise ValueError(f"federation must be a federation id, got {federation!r}")
        except (OSError, ValueError, TypeError, KeyError, AttributeError, ConfigError) as error:
            raise ConfigError(f"privacy accountant state {path} is unreadable ({error}); {fix}") from None
        if federation != self.federation:
            raise ConfigError(
                f"privacy accountant state {path} belongs to federation {federation!r}, not {self.federation!r}; "
                "move it back to where that federation's collaborator keeps it"
            )
        self.history, self.rounds = history, rounds


def _merged(history: History, run: tuple[float, float, int]) -> History:
    """Append a run, folding it into the last one when the settings are equal.

    Merging keeps the history short (PRV's cost grows with its length) and makes R
    rounds of tau steps the very same computation as one run of R * tau steps.
    """
    if history and history[-1][:2] == run[:2]:
        return [*history[:-1], (run[0], run[1], history[-1][2] + run[2])]
    return [*history, run]
