"""What each noised input costs this institution: charged to its ledger before the input leaves.

The ledger is the privacy part of the one-input record (:class:`~fedfair.runtime.collaborator.input_record.
InputRecord`): one file with the survivor bindings and the kept bits, so a budget cannot restart
while the record of what was answered survives, nor the other way round. The plan's ``[privacy]``
(:mod:`fedfair.runtime.plan.privacy`) says what is noised; the budget is the plan's, or this
institution's own ``budget_epsilon`` where that is lower.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np

from fedfair.privacy.distributed import Release
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.collaborator.input_record import InputRecord
from fedfair.runtime.composition_counts import CompositionColumn
from fedfair.runtime.logs import per_round
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.plan.privacy import ROUNDING_BETA, answer_release, party_mu, statistics_release
from fedfair.secagg import prg
from fedfair.secagg.noise import skellam

logger = logging.getLogger("fedfair.collaborator")


class Charges:
    """Charges this institution's noised inputs to its ledger, and noises its evaluation answers."""

    def __init__(self, config: CollaboratorConfig, shared: SharedSettings, record: InputRecord) -> None:
        self.config = config
        self.shared = shared
        self.record = record

    @property
    def budget(self) -> float:
        """The most epsilon this institution's releases may spend in all.

        The plan's [privacy] budget, or its own [privacy] budget_epsilon where that is lower.
        """
        own = self.config.privacy.budget_epsilon
        return self.shared.privacy.budget if own is None else min(self.shared.privacy.budget, own)

    def training(self, round_number: int, model: str, dimension: int) -> None:
        """Charge one distributed DP-SGD round on `model` to the ledger, before its noised words are kept and sent.

        Args:
            round_number: the round being charged.
            model: the model the round trains.
            dimension: how many values the update holds.

        Raises:
            PrivacyBudgetError: reason :attr:`BudgetReason.ANSWER_REFUSED` when the round would pass the
                budget (:meth:`InputRecord.charge`); nothing is charged.
        """
        privacy = self.shared.privacy
        noise, _ = self.shared.training_noise(self.shared.collaborator_count, dimension)
        # The add-on of rounding and wraps was counted for the plan's steps; each round carries its part.
        one_step = dataclasses.replace(noise.release, steps=1)
        addon = noise.addon / noise.release.steps
        spent = self.record.charge("train", round_number, model, one_step, privacy.delta, self.budget, addon=addon)
        logger.info(
            "%s: round %d: update noised inside the secure sum (Skellam, sensitivity %.4g units, q %.4g); "
            "epsilon %.3g of budget %g spent",
            self.config.name,
            round_number,
            noise.release.l2,
            noise.release.sampling_rate,
            spent,
            self.budget,
            extra=per_round(round_number, self.shared.training.rounds),
        )

    def evaluation(
        self, encoded: np.ndarray, round_number: int, model: str, columns: tuple[CompositionColumn, ...]
    ) -> None:
        """Under the plan's [privacy] report_epsilon.

        Charge this fresh answer to the ledger (PrivacyBudgetError past the budget), then add this party's share of the
        Skellam noise to its encoded words, from the OS's CSPRNG, before masking. A no-op for exact reports.
        """
        privacy = self.shared.privacy
        if not privacy.noised:
            return
        mu, spent = self._noise(encoded, "evaluate", round_number, model, answer_release(privacy, columns))
        logger.info(
            "%s: round %d evaluation: Skellam noise (mu %.4g per coordinate) added; epsilon %.3g of budget %g spent",
            self.config.name,
            round_number,
            mu,
            spent,
            self.budget,
            extra=per_round(round_number, self.shared.training.rounds),
        )

    def statistics(self, encoded: np.ndarray, round_number: int, model: str) -> None:
        """Under the plan's [privacy] report_epsilon: charge and noise the table statistics sent before round 1.

        As :meth:`evaluation` does for an answer, with the statistics' own release
        (:func:`~fedfair.runtime.plan.privacy.statistics_release`). A no-op for exact reports.
        """
        privacy, schema = self.shared.privacy, self.shared.schema
        if not privacy.noised or schema is None:
            return
        release = statistics_release(privacy, schema)
        mu, spent = self._noise(encoded, "statistics", round_number, model, release)
        logger.info(
            "%s: table statistics: Skellam noise (mu %.4g per coordinate; one record moves them by %.4g in L2, "
            "encoded units) added; epsilon %.3g of budget %g spent",
            self.config.name,
            mu,
            release.l2,
            spent,
            self.budget,
        )

    def _noise(
        self, encoded: np.ndarray, kind: str, round_number: int, model: str, release: Release
    ) -> tuple[float, float]:
        """Charge `release` to the ledger, then add this party's share of its noise to `encoded` in place.

        Every coordinate but the last, the weight (1 per answer: the count of answers, public anyway), gets
        Skellam noise from the OS's CSPRNG. Returns the share's mu and the epsilon spent so far.
        """
        privacy = self.shared.privacy
        spent = self.record.charge(kind, round_number, model, release, privacy.delta, self.budget, addon=ROUNDING_BETA)
        floor = self.shared.survivor_floor(self.shared.collaborator_count)
        mu = party_mu(release, floor, self.shared.secure_aggregation.max_colluding)
        noise = skellam(mu, encoded.size - 1, os.urandom(prg.KEY_BYTES))
        encoded[:-1] += noise.view(encoded.dtype)  # wraps modulo 2^k, as the masks do
        return mu, spent


def describe_ledger(record: InputRecord, delta: float | None = None) -> str:
    """The ledger of `record` for a person.

    What each kind of release cost, and the total epsilon at `delta` (by default the delta its releases were
    charged at).
    """
    entries = record.ledger()
    if not entries:
        return f"{record.path}: no noised input charged yet (epsilon 0)"
    at = delta if delta is not None else max(float(entry.get("delta", 1e-5)) for entry in entries)  # type: ignore[arg-type]
    lines = [f"{record.path}: epsilon {record.spent(at):.4g} spent at delta {at:g}, composed by RDP over"]
    for kind in sorted({str(entry["kind"]) for entry in entries}):
        rounds = sorted(int(entry["round"]) for entry in entries if entry["kind"] == kind)  # type: ignore[call-overload]
        rates = sorted({float(entry.get("sampling_rate", 1.0)) for entry in entries if entry["kind"] == kind})  # type: ignore[arg-type]
        sampled = ", Poisson sampling q = " + "/".join(f"{rate:g}" for rate in rates) if rates != [1.0] else ""
        lines.append(
            f"  {kind:<10} {len(rounds):>5} releases, rounds {rounds[0]}-{rounds[-1]} (Skellam inside the secure sum"
            f"{sampled})"
        )
    return "\n".join(lines)
