"""A plan in the two-verifier mode that its round cannot run as declared is refused at load, naming the fix.

Training DP under the mode: each verifier would add Skellam noise that the accountant does not charge yet. A bound
the proof's field cannot hold at the plan's fractional bits: every site's proof would fail. Both are refused at
the aggregator as the plan loads, and at a site as the plan arrives, before anything is sent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.runtime.plan.input_bound import check_bounded_round
from tests.runtime.test_input_bound import ON, declared, federation  # noqa: F401 (the fixture)
from tests.runtime.test_manifest import aggregator_plan_with
from tests.runtime.test_plan import aggregator_plan

DP = {"privacy": {"mode": "distributed", "epsilon": 3.0}, "training": {"local_steps": 1}}
"""Training DP as a plan may declare it (one DP-SGD step a round)."""


def test_training_dp_under_the_mode_is_refused_until_the_accountant_charges_the_verifiers_noise(
    federation: Path,  # noqa: F811
) -> None:
    with pytest.raises(ConfigError, match=r"not yet charged by the privacy accountant") as caught:
        aggregator_plan_with(federation, secure_aggregation=ON, **DP)
    said = str(caught.value)
    assert 'set [privacy] mode = "off", or input_bound = "none"' in said
    assert 'docs/security.md, "Bounded inputs (two verifiers)"' in said


def test_training_dp_without_the_mode_still_loads(federation: Path) -> None:  # noqa: F811
    assert aggregator_plan_with(federation, **DP).privacy.distributed


def test_a_bound_the_field_cannot_hold_is_refused_naming_fractional_bits(federation: Path) -> None:  # noqa: F811
    # update_norm 1 at 27 fractional bits (the masked sum's words hold them): B^2 = 2^54, beyond the 2^50 or so
    # the range tests leave room for.
    with pytest.raises(ConfigError, match=r"field at .* fractional_bits = 27 .*; lower fractional_bits to at most 25"):
        aggregator_plan_with(
            federation, secure_aggregation={**ON, "fractional_bits": 27}, influence={"update_norm": 1.0}
        )


def test_the_largest_bound_that_fits_passes_and_one_bit_more_does_not() -> None:
    """At update_norm 1 and weight 1, B^2 = 2^(2f): the check passes every f up to the largest the field holds."""
    secure = declared(aggregator_plan()).secure_aggregation

    def fits(fractional_bits: int) -> bool:
        try:
            check_bounded_round(secure, False, 1.0, [1.0], fractional_bits, "plan")
        except ConfigError:
            return False
        return True

    passing = [f for f in range(16, 31) if fits(f)]
    # The template's 20 bits fit; the field's range tests stop near B^2 = 2^50, so no f beyond 25 does.
    assert passing == list(range(16, passing[-1] + 1)) and 20 <= passing[-1] <= 25
