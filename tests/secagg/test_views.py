"""What each role reads of the masked sum under distributed DP (issue 93): the view audit of the masked kind.

Each site adds its Skellam share inside the sum, party_mu = MU / (floor - max(max_colluding, 1)), so the shares of
the smallest survivor set the round unmasks that no single reader knows (a site knows its own, the aggregator its
colluders') carry the whole noise the ledger charges: Skellam(MU), variance 2 MU per coordinate in encoded units
(:func:`fedfair.privacy.distributed.party_mu`). Each role's transcript comes from
the in-process round (:func:`simulate_round`, every message through its bytes; the aggregator chooses which
uploads count by letting the others drop before masking), and the reconstruction that role can make is applied to
it: it subtracts from the unmasked sum every noise it knows (its own and its colluders', redrawn from each one's
noise key) and every input it knows. What is left on what it wants to read (the exact sum of the others' inputs)
must be at least the charge.

The inputs lie on the encoding's grid, so the stochastic rounding moves none of them and what is left is noise
alone. No rotation: the round's rotation is public and orthogonal, so every role can undo it and it keeps each
coordinate's variance. The noise keys are fixed, as tests/secagg/helpers.py's are, so the audit is deterministic.

The tolerance: over d = 10^4 coordinates the sample variance of Skellam(mu) noise has relative standard deviation
sqrt((2 + 1 / (2 mu)) / d), at most 0.0142 for the smallest residual here (mu 50, the charge), so a band of 0.1 of
the share of the charge a role should face, either side of it, is 7 of them.
"""

from __future__ import annotations

import functools
import math
import tomllib
import warnings
from collections.abc import Collection
from pathlib import Path

import numpy as np
import pytest

from fedfair.cli import main as init_main
from fedfair.core.errors import PrivacyWarning, ThresholdError
from fedfair.privacy import distributed
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import EncodingConfig
from fedfair.secagg.noise import NoiseConfig
from fedfair.secagg.security import SecurityParameters
from fedfair.secagg.simulate import DropOut, simulate_round
from fedfair.secagg.wire import Stage
from tests.secagg.helpers import view_table

MU = 50.0
"""The charge: the Skellam mu of the whole sum that the ledger's release carries (encoded units)."""
DIMENSION = 10_000
FRACTIONAL_BITS = 16
GRID = 1000
"""Each input coordinate is a whole number of encoded units in [-GRID, GRID]."""


@functools.cache
def federation(parties: int, colluders: int) -> SecAggConfig:
    """A round of `parties` sites under `colluders` = max_colluding, each site's share of MU calibrated to the
    round's floor (its threshold t, the fewest survivors it unmasks)."""
    names = tuple(f"site-{i}" for i in range(1, parties + 1))
    plain = EncodingConfig(1.0, 1.0, FRACTIONAL_BITS, 64)
    security = SecurityParameters(max_colluding=colluders)
    floor = SecAggConfig("views", 1, names, DIMENSION, plain, security).t
    noise = NoiseConfig(mu=distributed.party_mu(MU, floor, colluders), norm_clip=2.0, dimension=DIMENSION)
    encoding = EncodingConfig(1.0, 1.0, FRACTIONAL_BITS, 64, noise=noise)
    return SecAggConfig("views", 1, names, DIMENSION, encoding, security)


def units(party: int) -> np.ndarray:
    """Site `party`'s input in encoded units (test data: numpy's generator never touches a key or a mask)."""
    return np.random.default_rng(party).integers(-GRID, GRID + 1, DIMENSION)


def noise_key(party: int) -> bytes:
    return bytes([party]) * 32


def noise_of(config: SecAggConfig, party: int) -> np.ndarray:
    """The noise site `party` added, as a colluder reads it: the encoding of zeros under its noise key (the
    rounding's stream leaves zeros alone and the noise's streams do not depend on the input)."""
    words = config.encoder.encode(np.zeros(DIMENSION), 1.0, randomness_key=noise_key(party))
    return words[:DIMENSION].view(np.int64)


def unmasked(config: SecAggConfig, dropped: Collection[int] = ()) -> tuple[np.ndarray, tuple[int, ...]]:
    """The sum the aggregator unmasks (signed encoded units) when it lets `dropped` fall silent before masking, and
    the parties whose inputs it covers."""

    def encoded(party: int) -> np.ndarray:
        vector = units(party) / 2.0**FRACTIONAL_BITS
        return config.encoder.encode(vector, 1.0, randomness_key=noise_key(party))

    result = simulate_round(config, encoded, DropOut({Stage.MASK: sorted(dropped)})).result
    return result.encoded_sum[:DIMENSION].view(np.int64), tuple(sorted(result.contributors))


def left_on_the_others(config: SecAggConfig, dropped: Collection[int], known: Collection[int]) -> float:
    """The variance left on the exact sum of the inputs the role does not know, over the charged 2 MU, once it
    subtracts from the unmasked sum the noise and input of every party in `known`."""
    total, contributors = unmasked(config, dropped)
    read = total - sum((noise_of(config, party) + units(party) for party in known), np.zeros(DIMENSION, np.int64))
    others = [units(party) for party in contributors if party not in known]
    residual = read - np.sum(others, axis=0)
    return float(residual.astype(np.float64).var()) / (2 * MU)


def near(share: float, expected: float) -> bool:
    """Whether a measured share of the charge is `expected`, within 7 standard deviations (module docstring)."""
    assert 7 * math.sqrt((2 + 1 / (2 * MU)) / DIMENSION) < 0.1
    return abs(share - expected) <= 0.1 * expected


THREE = (3, 0)
"""Three sites, max_colluding 0: the floor is 2, of which a survivor knows one share, so each site's share is MU."""
FOUR = (4, 1)
"""Four sites, max_colluding 1: the floor is 3, of which the aggregator knows its colluder's share, so each site's
share is MU / 2."""
TWO = (2, 0)
"""Two sites, max_colluding 0 (the most two sites allow, and `fedfair init`'s for them): the floor is 2, each site's
share MU, and every round is at the floor."""


def aggregator_view() -> float:
    """The aggregator, every upload counted: the sum less nothing, on the exact sum (three shares, three charges)."""
    return left_on_the_others(federation(*THREE), (), ())


def choosing_aggregator_view() -> float:
    """The aggregator keeping the fewest uploads the round unmasks (2 of 3): two shares, twice the charge."""
    return left_on_the_others(federation(*THREE), {3}, ())


def site_view() -> float:
    """Site 1 of three, every upload counted: the sum less its noise and input, on the others' sum (two shares,
    twice the charge)."""
    return left_on_the_others(federation(*THREE), (), {1})


def survivor_at_the_floor_view() -> float:
    """Site 1, one of two survivors at the floor with max_colluding 0: on the other survivor's input, one share,
    the whole charge."""
    return left_on_the_others(federation(*THREE), {3}, {1})


def site_of_two_view() -> float:
    """Site 1 of two, every round: the sum less its noise and input, on the other site's input (one share, the whole
    charge), as a survivor at a 2-of-3 floor but in every round, not only when a site drops."""
    with warnings.catch_warnings():
        # The round's own warning that each of two parties infers the other's input: what this view measures.
        warnings.simplefilter("ignore", PrivacyWarning)
        return left_on_the_others(federation(*TWO), (), {1})


def colluding_aggregator_view() -> float:
    """The aggregator with max_colluding = 1 site, keeping the floor's 3 of 4 uploads: less the colluder's noise
    and input, on the two honest survivors' sum (two shares, the whole charge). A survivor at that floor that
    subtracts its own reads the same."""
    return left_on_the_others(federation(*FOUR), {4}, {1})


def test_a_round_unmasks_no_sum_below_its_floor() -> None:
    """The aggregator choosing which uploads count gets no sum of fewer than the floor, where the noise would fall
    short of the charge."""
    assert federation(*THREE).t == 2 and federation(*FOUR).t == 3
    with pytest.raises(ThresholdError):
        unmasked(federation(*THREE), {2, 3})
    with pytest.raises(ThresholdError):
        unmasked(federation(*FOUR), {3, 4})


def test_the_aggregator_reads_the_sum_under_every_uploads_noise() -> None:
    assert near(aggregator_view(), 3.0)


def test_the_aggregator_keeping_the_fewest_uploads_it_may_reads_the_sum_under_the_charge() -> None:
    assert near(choosing_aggregator_view(), 2.0)


def test_a_site_less_its_own_noise_and_input_reads_the_others_under_the_charge() -> None:
    assert near(site_view(), 2.0)


def test_the_aggregator_with_max_colluding_sites_at_the_floor_reads_the_honest_sum_under_the_charge() -> None:
    assert near(colluding_aggregator_view(), 1.0)


def test_a_survivor_at_a_two_of_three_floor_reads_the_other_under_the_whole_charge() -> None:
    """Red team of issue 93: calibrated to the floor less max_colluding, each of two survivors added half the
    variance, and one that subtracted its own read the other's input at 0.497 of the charge (a release charged at
    epsilon 1.00, delta 1e-5, L1 40, L2 10: mu 818.8, faced as mu 409.4: epsilon 1.46). Each share is now the
    whole charge, so the survivor faces the release its ledger charges."""
    assert near(survivor_at_the_floor_view(), 1.0)
    assert distributed.party_mu(MU, federation(*THREE).t, 0) == MU


def test_a_site_of_two_reads_the_other_under_the_whole_charge_in_every_round(tmp_path: Path) -> None:
    """With two sites each is always a survivor at the floor, so it reads the other's input (evaluation answers and
    statistics under init's report_epsilon) in every round: at the whole charge, for the plan `fedfair init
    --sites a,b` writes."""
    assert near(site_of_two_view(), 1.0) and federation(*TWO).t == 2
    assert init_main(["init", str(tmp_path / "two"), "--sites", "a,b"]) == 0
    plan = tomllib.loads((tmp_path / "two" / "aggregator" / "plan.toml").read_text())
    assert plan["secure_aggregation"]["max_colluding"] == 0 and plan["privacy"]["report_epsilon"] == 1.0


def test_every_noise_subtracted_leaves_the_exact_sum() -> None:
    """The control: a reconstruction that subtracts every site's noise is exact, so the views measure noise that
    is there, not an error of the audit."""
    config = federation(*THREE)
    total, contributors = unmasked(config, {3})
    noises = np.sum([noise_of(config, party) for party in contributors], axis=0)
    np.testing.assert_array_equal(total - noises, np.sum([units(party) for party in contributors], axis=0))


def who_reads_what() -> str:
    """docs/security.md's masked "Who reads what" table, with what this audit measures in each row.

    Regenerate it with ``python -m tests.secagg.test_views``.
    """
    return view_table(
        [
            (
                "the aggregator, every upload (3 of 3, floor 2)",
                "the unmasked sum",
                "nothing",
                f"on the sum: three sites' noise, {aggregator_view():.3f} of the charge",
            ),
            (
                "the aggregator keeping the uploads it likes",
                "the unmasked sum of those it kept",
                "nothing",
                "below the floor: no sum (ThresholdError); at the floor, 2 of 3: on the sum, two sites' noise, "
                f"{choosing_aggregator_view():.3f} of the charge",
            ),
            (
                "a site (3 of 3)",
                "the sum, its input, its noise key",
                "its noise, its input",
                f"on the others' sum: two sites' noise, {site_view():.3f} of the charge",
            ),
            (
                "a survivor at the floor, max_colluding = 0 (2 of 3)",
                "the sum, its input, its noise key",
                "its noise, its input",
                f"on the other survivor's input: its noise, {survivor_at_the_floor_view():.3f} of the charge",
            ),
            (
                "a site of two, max_colluding = 0 (2 of 2; `fedfair init --sites a,b`)",
                "the sum, its input, its noise key",
                "its noise, its input",
                f"on the other site's input: its noise, {site_of_two_view():.3f} of the charge, in every round",
            ),
            (
                "the aggregator with max_colluding = 1 site, at the floor (3 of 4); or a survivor there",
                "the sum, the colluder's input and noise key",
                "the colluder's noise and input",
                f"on the two honest sites' sum: their noise, {colluding_aggregator_view():.3f} of the charge",
            ),
        ]
    )


def test_docs_carry_the_masked_who_reads_what_table_this_audit_measures() -> None:
    assert who_reads_what() in (Path(__file__).parents[2] / "docs" / "security.md").read_text()


if __name__ == "__main__":
    print(who_reads_what(), end="")
