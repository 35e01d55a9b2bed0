"""The core's settings: valid values build, invalid ones are refused with their fix, and no torch is imported."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.config import (
    AVERAGE_FROM,
    BATCH_FRACTION,
    BOUND,
    DRIFT_CORRECTIONS,
    EPSILON,
    FACTORY_PATH,
    GAMMA,
    RHO,
    SERVER_MOMENTUM,
    SMOOTH_FUNCTIONS,
    STEP_SIZE,
    Interval,
    LocalConfig,
    ObjectiveConfig,
    TrainingConfig,
    check_smooth_plus,
)
from fedfair.core.errors import ConfigError


@pytest.mark.parametrize(
    ("interval", "inside", "outside"),
    [
        (RHO, (1e-300, 0.5, 1.0, 1), (0.0, -0.0, 1.0 + 1e-15, 2)),
        (EPSILON, (0.0, 1.0, 0, 1), (-1e-300, 1.0 + 1e-15)),
        (BATCH_FRACTION, (1e-9, 1.0), (0.0, 1.5)),
        (AVERAGE_FROM, (0.0, 0.999), (1.0, -0.1)),
        (GAMMA, (1e-300, 1e300), (0.0, -1.0)),
    ],
)
def test_an_interval_holds_its_closed_ends_and_not_its_open_ones(
    interval: Interval, inside: tuple[float, ...], outside: tuple[float, ...]
) -> None:
    assert all(value in interval for value in inside)
    assert not any(value in interval for value in outside)


@pytest.mark.parametrize("interval", [RHO, EPSILON, GAMMA, BOUND, STEP_SIZE, BATCH_FRACTION, AVERAGE_FROM])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, False, "0.5", None])
def test_no_interval_holds_a_non_finite_value_a_bool_or_a_non_number(interval: Interval, value: object) -> None:
    """inf is above 0, True equals 1 and "0.5" reads as a number: none may pass as a setting."""
    assert value not in interval


@pytest.mark.parametrize(
    ("interval", "expected"),
    [
        (RHO, "a number in (0, 1] (the smallest group protected)"),
        (EPSILON, "a number in [0, 1] (1 = ERM, 0 = CVaR)"),
        (AVERAGE_FROM, "a number in [0, 1) (the fraction of rounds before iterates enter the average)"),
        (STEP_SIZE, "a number > 0"),
        (Interval(2.0), "a number >= 2"),
        (Interval(0.5, 2.5, low_open=True, high_open=True), "a number in (0.5, 2.5)"),
    ],
)
def test_an_interval_is_quoted_with_brackets_that_say_which_ends_it_holds(interval: Interval, expected: str) -> None:
    assert interval.expected == expected


SETTINGS = st.one_of(st.floats(), st.integers(-2, 2), st.booleans(), st.sampled_from([0.0, 1.0, 5e-324, 1 - 1e-16]))


@settings(max_examples=60, deadline=None)
@given(value=SETTINGS)
def test_the_settings_accept_exactly_the_values_their_stated_interval_holds(value: float) -> None:
    """One rule per setting: the plan reader quotes these intervals, so the objects must check no other."""
    for interval, build in (
        (RHO, lambda: ObjectiveConfig(rho=value)),
        (EPSILON, lambda: ObjectiveConfig(epsilon=value)),
        (GAMMA, lambda: ObjectiveConfig(gamma=value)),
        (BOUND, lambda: ObjectiveConfig(bound=value)),
        (STEP_SIZE, lambda: LocalConfig(lr=value)),
        (STEP_SIZE, lambda: LocalConfig(threshold_lr=value)),
        (BATCH_FRACTION, lambda: TrainingConfig(batch_fraction=value)),
        (AVERAGE_FROM, lambda: TrainingConfig(average_from=value)),
        (SERVER_MOMENTUM, lambda: TrainingConfig(server_momentum=value)),
    ):
        try:
            build()
        except ConfigError:
            assert value not in interval
        else:
            assert value in interval


@settings(max_examples=40, deadline=None)
@given(rho=st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0, exclude_min=True), st.just(math.nan)))
def test_any_rho_outside_zero_to_one_is_refused_with_an_example_flag(rho: float) -> None:
    with pytest.raises(ConfigError, match=re.escape("rho must be in (0, 1]") + ".*--rho 0.3"):
        ObjectiveConfig(rho=rho)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": math.nan}, re.escape("epsilon must be in [0, 1], got nan") + ".*--epsilon 0.1"),
        ({"epsilon": 1.0 + 1e-12}, re.escape("epsilon must be in [0, 1]") + ".*1 is plain ERM, 0 is CVaR"),
        ({"gamma": math.inf}, "gamma must be a positive number, got inf; pass --gamma 0.05"),
        ({"gamma": math.nan}, "gamma must be a positive number, got nan"),
        ({"bound": math.inf}, "bound must be a positive number, got inf; it caps the threshold c, e.g. --bound 10"),
        ({"bound": math.nan}, "bound must be a positive number, got nan"),
    ],
)
def test_non_finite_and_out_of_range_knobs_are_refused_naming_the_knob_and_a_fix(
    kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        ObjectiveConfig(**kwargs)


def test_an_unknown_smooth_function_is_refused_listing_every_known_one() -> None:
    with pytest.raises(ConfigError, match="unknown smooth plus function 'softrelo'; choose one of: ") as refused:
        ObjectiveConfig(smooth="softrelo")
    assert all(name in str(refused.value) for name in SMOOTH_FUNCTIONS)
    for name in SMOOTH_FUNCTIONS:
        check_smooth_plus(name, 0.05)  # each listed choice is accepted, so the message never lists a dead end


def test_objective_settings_are_immutable_values() -> None:
    """Frozen, compared by value: the plan reader, the flags and the simulation can share and compare them."""
    config = ObjectiveConfig(epsilon=0.2, rho=0.4)
    assert config == ObjectiveConfig(epsilon=0.2, rho=0.4) and config != ObjectiveConfig(epsilon=0.2, rho=0.5)
    assert hash(config) == hash(ObjectiveConfig(epsilon=0.2, rho=0.4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.rho = 0.5  # type: ignore[misc]
    with pytest.raises(ConfigError, match="rho must be in"):
        dataclasses.replace(config, rho=0.0)  # a copy is checked like a fresh one


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold_lr": 0.0}, "threshold_lr must be a positive number, got 0.0; e.g. --threshold-lr 0.1"),
        ({"threshold_lr": math.inf}, "threshold_lr must be a positive number, got inf"),
        ({"lr": math.nan}, "lr must be a positive number, got nan; e.g. --lr 0.1"),
    ],
)
def test_step_sizes_are_refused_naming_the_flag_that_fixes_them(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        LocalConfig(**kwargs)  # type: ignore[arg-type]


def test_an_unknown_drift_correction_is_refused_listing_the_choices_and_the_flag() -> None:
    message = "unknown drift correction 'fedprox'; choose one of: none, scaffold (e.g. --drift-correction scaffold)"
    with pytest.raises(ConfigError, match=re.escape(message)):
        LocalConfig(drift_correction="fedprox")


@pytest.mark.parametrize("name", DRIFT_CORRECTIONS)
def test_only_none_leaves_local_steps_without_control_variates(name: str) -> None:
    assert LocalConfig(drift_correction=name).corrects_drift == (name != "none")


@pytest.mark.parametrize(
    ("path", "valid"),
    [
        ("mymodels.tabular:build", True),
        ("models:build", True),
        ("_private.pkg_2:Factory.create", True),
        ("mymodels.tabular", False),  # no function
        ("mymodels:", False),
        (":build", False),
        ("my-models:build", False),  # not an import name
        ("2models:build", False),
        ("models:build()", False),  # a call, not a name
        ("models:build:extra", False),
        ("models.:build", False),
        ("models:build\n", False),
    ],
)
def test_a_factory_path_is_a_dotted_module_a_colon_and_a_dotted_name(path: str, valid: bool) -> None:
    assert (FACTORY_PATH.fullmatch(path) is not None) == valid


def test_reading_the_settings_imports_no_torch() -> None:
    """The plan reader and the CLI build these objects; they must not pay for importing torch."""
    probe = "import sys, fedfair.core.config; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "False"
