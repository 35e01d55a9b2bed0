"""What a bounded round's site encodes and reads, without a federation (issue 80).

A site's encoding always passes its bound, so an honest site at exactly its bound is never excluded (a property
over random updates at, under and over the bound), and it moves each coordinate of a clipped update by under
2^-f. The verdict record a site reads at DECIDE fits the input limit it admits there, which grows with the model
and the roster.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.runtime.collaborator.kinds.bounded import bounded_encoding
from fedfair.runtime.peer.uplink import input_limit
from fedfair.runtime.plan import aggregator_plan as plan
from fedfair.runtime.contract import EVALUATION, Aggregations
from tests.runtime.wire_stages import BOUNDED_TRAINING
from fedfair.runtime.transport import make_binding, pb
from fedfair.secagg.bounded.layout import squared_bound
from fedfair.secagg.bounded.simulate import simulate_bounded_round
from tests.runtime.test_input_bound import declared
from tests.runtime.test_plan import aggregator_plan
from tests.runtime.wire_stages import WIRE


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 300),
    scale=st.sampled_from([0.5, 1.0, 1.0 + 2**-30, 3.0]),
    seed=st.integers(0, 2**16),
)
def test_a_sites_encoding_is_within_its_bound_at_and_beyond_it(size: int, scale: float, seed: int) -> None:
    """What a site shares always passes its bound (an honest site at exactly its bound is never excluded), and moves
    each coordinate of a clipped update by under 2^-f."""
    shared = plan.load_shared_settings(plan.shared_settings(declared(aggregator_plan())))
    influence, bits = shared.influence, shared.secure_aggregation.fractional_bits
    direction = np.random.default_rng(seed).normal(size=size)
    update = direction * (scale * influence.update_norm / np.linalg.norm(direction))  # weight 1 (equal weights)
    encoded = bounded_encoding(update, "hospital-a", shared)
    assert sum(int(v) ** 2 for v in encoded) <= squared_bound(influence.update_norm, 1.0, bits)
    within = update * min(1.0, 1.0 / scale)  # an update over its bound is scaled back to it
    assert np.max(np.abs(np.ldexp(encoded.astype(np.float64), -bits) - within)) < 2.0**-bits * (1 + 1e-9)


@pytest.mark.parametrize("sites", [3, 10])
def test_a_verdict_record_at_ten_thousand_parameters_is_within_what_a_site_reads(sites: int) -> None:
    """The record holds both verifiers' messages for every site: the cap grows with the model and the roster."""
    parameters = 10_000
    weights = dict.fromkeys(range(1, sites + 1), 1.0)
    trace = simulate_bounded_round(
        dimension=parameters + 1,
        fractional_bits=16,
        update_norm=1.0,
        weights=weights,
        encoded_input=lambda party: np.zeros(parameters + 1, np.int64),
    )
    task = pb.Task(binding=make_binding("", 0, WIRE["STAGE_BOUNDED_DECIDE"]))
    BOUNDED = Aggregations(BOUNDED_TRAINING, EVALUATION)
    assert trace.record_bytes <= input_limit(task, BOUNDED, sites, parameters, 0)
    # Not the secure stages' flat cap: the record outgrows it with d (10.7 MB at d = 10^6, n = 10).
    assert input_limit(task, BOUNDED, sites, 10**6, 0) > 10.7e6
