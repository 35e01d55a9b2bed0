"""A plan in the two-verifier mode: training DP runs under it, and a bound its field cannot hold is refused.

Training DP under the mode: the auditor adds the whole noise a masked round's accountant asks for, at the same
fractional bits, so the plan loads and every party derives the same noise from it. A bound the proof's field
cannot hold at the round's fractional bits: every site's proof would fail. It is refused at the aggregator as the
plan loads, and at a site as the plan arrives, before anything is sent.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.runtime.plan.bounded_noise import bounded_fractional_bits, bounded_noise_mu
from fedfair.runtime.plan.bounded_check import bounded_soundness_line, check_bounded_plan
from fedfair.runtime.plan.input_bound import check_bounded_round, soundness_line
from fedfair.secagg.bounded.layout import largest_dimension, squared_bound
from tests.runtime.test_input_bound import ON, declared, federation  # noqa: F401 (the fixture)
from tests.runtime.test_manifest import aggregator_plan_with
from tests.runtime.test_plan import aggregator_plan

DP = {"privacy": {"mode": "distributed", "epsilon": 3.0, "report_epsilon": 1.0}, "training": {"local_steps": 1}}
"""Training DP as a plan may declare it (one DP-SGD step a round)."""


def test_training_dp_under_the_mode_loads_with_the_masked_rounds_noise_at_the_auditor(
    federation: Path,  # noqa: F811
) -> None:
    """The auditor's mu and the sites' bits are the masked round's total mu and bits for the same plan, exactly."""
    bounded = aggregator_plan_with(federation, secure_aggregation=ON, **DP)
    masked = aggregator_plan_with(federation, **DP)
    parties, dimension = len(bounded.collaborators), 1000
    noise, _ = masked.training_noise(parties, dimension)
    assert bounded_noise_mu(bounded, parties, dimension) == noise.release.mu > 0
    assert bounded_fractional_bits(bounded, parties, dimension) == noise.fractional_bits
    encoding = bounded.training_encoding(bounded.federation_id, parties, 1, dimension)
    assert encoding.noise is None  # no site noises its input: its bound and its proof are unchanged
    assert encoding.fractional_bits == noise.fractional_bits
    assert bounded_noise_mu(masked, parties, dimension) == noise.release.mu  # one calibration, whichever round
    plain = aggregator_plan_with(federation, secure_aggregation=ON)
    assert bounded_noise_mu(plain, parties, dimension) == 0.0
    assert bounded_fractional_bits(plain, parties, dimension) == plain.secure_aggregation.fractional_bits


def test_under_dp_a_bound_the_noises_bits_cannot_hold_is_refused_naming_update_norm(
    federation: Path,  # noqa: F811
) -> None:
    """The noise's bits follow from one record's sensitivity, so only a smaller update_norm can fit the field."""
    with pytest.raises(ConfigError, match=r"the distributed noise's fractional_bits = \d+ .*; lower update_norm"):
        aggregator_plan_with(federation, secure_aggregation=ON, influence={"update_norm": 1e6}, **DP)


def test_training_dp_without_the_mode_still_loads(federation: Path) -> None:  # noqa: F811
    assert aggregator_plan_with(federation, **DP).privacy.distributed


def test_a_bound_the_field_cannot_hold_is_refused_naming_fractional_bits(federation: Path) -> None:  # noqa: F811
    # update_norm 1 at 27 fractional bits (the masked sum's words hold them): B^2 = 2^54, beyond the 2^43
    # the range tests leave room for.
    with pytest.raises(ConfigError, match=r"field at .* fractional_bits = 27 .*; lower fractional_bits to at most 21"):
        aggregator_plan_with(
            federation, secure_aggregation={**ON, "fractional_bits": 27}, influence={"update_norm": 1.0}
        )


def test_the_largest_bound_that_fits_passes_and_one_bit_more_does_not() -> None:
    """At update_norm 1 and weight 1, B^2 = 2^(2f): the check passes every f up to the largest the field holds."""
    secure = declared(aggregator_plan()).secure_aggregation

    def fits(fractional_bits: int) -> bool:
        try:
            check_bounded_round(secure, 1.0, [1.0], fractional_bits, "plan")
        except ConfigError:
            return False
        return True

    passing = [f for f in range(16, 31) if fits(f)]
    # The template's 20 bits fit; the field's range tests stop near B^2 = 2^43 (p = 2^52 - 47), so no f beyond 21 does.
    assert passing == list(range(16, 22))


LARGE_MODEL = 2**26
"""Coordinates at which init's bound (B = 2^20, T = 2^24) no longer fits: 4 d T reaches p = 2^52 - 47."""


def test_the_plan_check_refuses_a_model_the_round_would_refuse_naming_its_size_and_the_fixes() -> None:
    """The check holds the round's Layout(d, B^2), not Layout(1, B^2): init's plan fits 2^26 - 1 coordinates and
    no more."""
    secure = declared(aggregator_plan()).secure_aggregation
    check_bounded_round(secure, 1.0, [1.0], 20, "plan", dimension=LARGE_MODEL - 1)
    with pytest.raises(ConfigError) as refused:
        check_bounded_round(secure, 1.0, [1.0], 20, "plan", dimension=LARGE_MODEL)
    said = str(refused.value)
    assert f"the model's dimension {LARGE_MODEL:,}" in said and "B^2 = 2^40.0" in said, said
    assert f"at most {LARGE_MODEL - 1:,} coordinates" in said, said
    # One bit fewer halves T, so twice the coordinates fit: 19 is the most at 2^26.
    assert "lower fractional_bits to at most 19, lower update_norm, or train a smaller model" in said, said
    check_bounded_round(secure, 1.0, [1.0], 19, "plan", dimension=LARGE_MODEL)
    with pytest.raises(ConfigError, match=r"dimension .* lower update_norm, or train a smaller model"):
        check_bounded_round(secure, 1.0, [1.0], 20, "plan", dimension=LARGE_MODEL, noised=True)


def test_a_plan_is_held_at_its_models_size_where_it_is_known() -> None:
    """Loaded alone the plan holds the bound alone (no model is built); with the model's parameters, as plan show,
    plan pin and the aggregator before round 1 pass them, it holds the round's dimension too."""
    bounded = declared(aggregator_plan())
    weight = max(bounded.influence.weight_of(name, bounded.batch_fraction) for name in bounded.collaborators)
    bound_sq = squared_bound(bounded.influence.update_norm, weight, bounded.secure_aggregation.fractional_bits)
    most = largest_dimension(bound_sq)
    assert not bounded.training.local.corrects_drift  # the round's d is the parameters and the weight: d = D + 1
    sites = len(bounded.collaborators)
    check_bounded_plan(bounded, sites, "plan.toml", None)
    check_bounded_plan(bounded, sites, "plan.toml", most - 1)
    assert f"limit at d = {most:,} " in bounded_soundness_line(bounded, sites, most - 1)
    with pytest.raises(ConfigError, match=rf"plan.toml: .* the model's dimension {most + 1:,}"):
        check_bounded_plan(bounded, sites, "plan.toml", most)


def test_the_soundness_line_states_the_tests_the_error_and_the_bound_against_the_fields_limit() -> None:
    """docs/security.md's table: 151 tests at init's B = 2^20, 515 at the largest B^2 = 2^43.4, each 2^-64 a try."""
    for norm, tests in ((1.0, 151), (3355442 / 2**20, 515)):
        line = soundness_line(norm, 1.0, 20, 10**5)
        bound_sq = squared_bound(norm, 1.0, 20)
        assert f"{tests} range tests a try" in line, line
        assert "at most 2^-64." in line, line
        assert f"B^2 = 2^{math.log2(bound_sq):.1f}" in line and "limit at d = 100,000 2^43.4" in line, line
