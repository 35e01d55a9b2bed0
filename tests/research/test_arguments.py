"""The torch-free experiment flags default to the very settings the simulation and the core define."""

from __future__ import annotations

import argparse

from fedfair.core.config import LocalConfig, TrainingConfig
from fedfair.research.arguments import add_experiment_arguments
from fedfair.simulation.rounds import DTYPES, SimulationOptions


def test_the_flags_default_to_the_core_schedule_and_the_simulations_options() -> None:
    parser = argparse.ArgumentParser()
    add_experiment_arguments(parser)
    defaults = parser.parse_args([])
    assert (defaults.rounds, defaults.average_from, defaults.seed) == (
        TrainingConfig.rounds,
        TrainingConfig.average_from,
        TrainingConfig.seed,
    )
    assert (defaults.local_steps, defaults.drift_correction) == (LocalConfig.local_steps, LocalConfig.drift_correction)
    assert (defaults.device, defaults.dtype) == (SimulationOptions.device, SimulationOptions.dtype)
    dtype_action = next(action for action in parser._actions if action.dest == "dtype")
    assert tuple(dtype_action.choices or ()) == tuple(DTYPES)
