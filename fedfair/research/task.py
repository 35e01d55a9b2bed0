"""What every method of an experiment trains on and with: a `Task`, and the settings of a method that takes none.

Each method runs as ``run(task, settings)``, its settings a frozen dataclass beside its run function
(`fedfair.research.methods` lists them by name).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedfair.core.config import ObjectiveConfig, TrainingConfig
from fedfair.core.errors import ConfigError
from fedfair.privacy.config import PrivacyConfig
from fedfair.simulation.federation import Federation
from fedfair.simulation.rounds import RoundCallback, SimulationOptions


@dataclass(frozen=True)
class NoSettings:
    """A method that takes no settings of its own."""


@dataclass(frozen=True)
class Task:
    """What every method trains on and with: the federation and the settings all methods share."""

    federation: Federation
    objective: ObjectiveConfig
    training: TrainingConfig
    privacy: PrivacyConfig
    options: SimulationOptions = SimulationOptions()
    secure_aggregation: bool = False
    on_round: RoundCallback | None = None
    colluders: int = 0
    """Under distributed DP, the sites that may collude with the aggregator (the others carry the noise)."""

    def __post_init__(self) -> None:
        """Refuse distributed DP without the secure sum: its sites add no noise of their own."""
        if self.privacy.enabled and self.privacy.mode == "distributed" and not self.secure_aggregation:
            raise ConfigError(
                "distributed DP adds its noise inside the secure sum and none at the sites; "
                "pass --secure-aggregation (Task.secure_aggregation = True)"
            )
