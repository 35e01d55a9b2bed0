"""The security parameters of a federation's secure sums: one value, fixed once, read wherever they act.

The collusion bound c, the threshold t (or None for the threshold rule's smallest) and the masking graph's degree
are the plan's, held to the manifest the institutions agreed on where the two meet
(:meth:`fedfair.runtime.plan.learning_settings.SecureAggregationSettings.security`, after
:func:`fedfair.runtime.manifest_plan.check_bounds`). That one value then travels whole: in the round's public
parameters (:class:`fedfair.runtime.contract.RoundParameters`), in each session's
:class:`~fedfair.secagg.config.SecAggConfig`, to the survivor checks of both sides and the accusation rule
(:meth:`fedfair.secagg.round.SecureSum.excluded`), to the plan's noise floor
(:func:`fedfair.runtime.plan.privacy.plan_floor`), and to the comparison a collaborator makes of a round against
its own plan (:meth:`SecurityParameters.differences`). The manifest's min_round_size is no part of it: the aggregator
need not hold that bound, so a round's parameters cannot state it (docs/design.md section 5).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedfair.core.errors import ConfigError


@dataclass(frozen=True)
class SecurityParameters:
    """The bounds every secure sum of a federation assumes and enforces.

    max_colluding: c, how many parties may collude with the aggregator (and lie) without breaking privacy; the
        threshold must satisfy the rule for this c, and an accusation excludes a party only when more than c
        distinct parties make it.
    threshold: t, how many share holders must survive to unmask; None for the smallest t the threshold rule
        allows each round (:func:`fedfair.secagg.config.threshold_for`).
    neighbours: k for a k-regular SecAgg+ masking graph drawn per round; None (or k >= n - 1) for the complete
        graph.

    Raises:
        ConfigError: a negative collusion bound, or a degree below 1.
    """

    max_colluding: int = 0
    threshold: int | None = None
    neighbours: int | None = None

    def __post_init__(self) -> None:
        if self.max_colluding < 0:
            raise ConfigError(f"max_colluding={self.max_colluding} is negative; use 0 or more")
        if self.neighbours is not None and self.neighbours < 1:
            raise ConfigError(f"neighbours={self.neighbours} must be at least 1, or None for the complete graph")

    @property
    def isolating(self) -> int:
        """The fewest parties a sum may have so that two honest inputs hide beside the colluders: c + 2."""
        return self.max_colluding + 2

    def differences(self, stated: SecurityParameters) -> list[str]:
        """What of `stated` (a round's) differs from these (a party's own plan), by name.

        "threshold", "neighbours" and "collusion bound", in that order; empty when they agree.
        """
        return [
            what
            for what, wrong in (
                ("threshold", stated.threshold != self.threshold),
                ("neighbours", stated.neighbours != self.neighbours),
                ("collusion bound", stated.max_colluding != self.max_colluding),
            )
            if wrong
        ]
