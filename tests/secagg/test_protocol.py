"""The secure-aggregation protocol end to end: the exact sum, recovered through dropouts at each of the six
stages, on the complete graph and on SecAgg+ graphs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from fedfair.core.errors import PrivacyWarning, ProtocolError, ThresholdError
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.messages import MaskedInput, Message, ShareKeys
from fedfair.secagg.wire import SUM_STAGES, Stage
from fedfair.secagg.server import AggregateResult
from fedfair.secagg.simulate import DropOut, simulate_round
from tests.secagg.helpers import (
    Harness,
    check_result,
    encode_all,
    make_config,
    make_inputs,
)


def run(
    config: SecAggConfig,
    drop: dict[Stage, list[int]] | None = None,
    seed: int = 0,
    observe: object = None,
) -> tuple[AggregateResult, dict[int, tuple[np.ndarray, float]], dict[int, np.ndarray]]:
    inputs = make_inputs(config, seed)
    encoded = encode_all(config, inputs)
    # Masking happens in place, so every party gets a copy and the originals stay plain.
    trace = simulate_round(config, lambda party: encoded[party].copy(), DropOut(drop or {}), observe)  # type: ignore[arg-type]
    return trace.result, inputs, encoded


def dropout_cases() -> list[object]:
    """(n, stage, how many drop) for every stage and every count from 1 to n - t (for n = 10: 1 and n - t)."""
    cases = []
    for parties in (3, 5, 10):
        spare = parties - (parties // 2 + 1)
        counts = range(1, spare + 1) if parties < 10 else (1, spare)
        cases += [
            pytest.param(parties, stage, count, id=f"n{parties}-{stage.name}-{count}")
            for stage in SUM_STAGES
            for count in counts
        ]
    return cases


def test_no_dropout_recovers_the_sum_exactly() -> None:
    for parties in (3, 5, 10):
        config = make_config(parties)
        result, inputs, encoded = run(config)
        check_result(result, config, inputs, encoded, set(range(1, parties + 1)))
        assert all(not dropped for dropped in result.dropped.values())
        assert set(result.dropped) == set(SUM_STAGES)
        assert not result.culprits and not result.accusations


@pytest.mark.parametrize(("parties", "max_colluding"), [(5, 1), (7, 2), (6, 1)])
def test_colluder_tolerant_thresholds_recover_the_sum_through_dropouts(parties: int, max_colluding: int) -> None:
    config = make_config(parties, max_colluding=max_colluding)
    assert 2 * config.t > parties + max_colluding and config.t >= max_colluding + 2
    spare = parties - config.t
    drop = {Stage.MASK: [2]} if spare == 1 else {Stage.MASK: [2], Stage.UNMASK: [parties]}
    result, inputs, encoded = run(config, drop)
    check_result(result, config, inputs, encoded, set(range(1, parties + 1)) - {2})


def test_seeded_default_threshold_is_unchanged_without_colluders() -> None:
    # Existing seeded runs depend on t = floor(n/2) + 1 when max_colluding is 0.
    with pytest.warns(PrivacyWarning):
        assert make_config(2).t == 2
    assert [make_config(parties).t for parties in (3, 4, 5, 10, 11)] == [2, 3, 3, 6, 6]


@pytest.mark.parametrize(("parties", "stage", "count"), dropout_cases())
def test_dropouts_at_every_stage_up_to_n_minus_t(parties: int, stage: Stage, count: int) -> None:
    config = make_config(parties)
    dropped = list(range(2, 2 + count))
    result, inputs, encoded = run(config, {stage: dropped}, seed=parties * 10 + count)
    everyone = set(range(1, parties + 1))
    # Parties that leave after masking are still in the sum; earlier leavers are not.
    after_masking = stage in (Stage.CONSISTENCY, Stage.UNMASK)
    contributors = everyone if after_masking else everyone - set(dropped)
    check_result(result, config, inputs, encoded, contributors)
    assert result.dropped[stage] == tuple(dropped)


@pytest.mark.parametrize("parties", [5, 10])
def test_dropouts_spread_over_all_stages(parties: int) -> None:
    config = make_config(parties)
    spare = parties - config.t
    stages = list(itertools.islice(itertools.cycle(Stage), spare))
    drop: dict[Stage, list[int]] = {}
    for party, stage in zip(range(parties, 0, -1), stages, strict=False):
        drop.setdefault(stage, []).append(party)
    result, inputs, encoded = run(config, drop)
    gone_before_masking = {p for stage, ps in drop.items() if stage < Stage.CONSISTENCY for p in ps}
    check_result(result, config, inputs, encoded, set(range(1, parties + 1)) - gone_before_masking)


@pytest.mark.parametrize("stage", SUM_STAGES)
def test_below_threshold_aborts_cleanly(stage: Stage) -> None:
    config = make_config(5)
    too_many = list(range(1, 5 - config.t + 2))
    with pytest.raises(ThresholdError, match="below the threshold"):
        run(config, {stage: too_many})


def test_an_aborted_round_refuses_everything_after() -> None:
    config = make_config(3)
    server = Harness(config).server
    with pytest.raises(ThresholdError, match="round aborted"):
        server.key_directory()
    with pytest.raises(ProtocolError, match="aborted"):
        server.share_bundles()


@pytest.mark.parametrize("modulus_bits", [32, 64])
def test_secagg_plus_graph_recovers_the_sum_through_dropouts(modulus_bits: int) -> None:
    config = make_config(10, neighbours=4, modulus_bits=modulus_bits)
    assert config.t == 3
    drop = {Stage.MASK: [4], Stage.UNMASK: [7]}
    result, inputs, encoded = run(config, drop)
    check_result(result, config, inputs, encoded, set(range(1, 11)) - {4})


def test_secagg_plus_parties_share_only_with_their_neighbours() -> None:
    config = make_config(10, neighbours=4)
    recipients: dict[int, set[int]] = {}

    def observe(message: Message) -> None:
        if isinstance(message, ShareKeys):
            recipients[message.sender] = {entry.recipient for entry in message.shares}

    run(config, observe=observe)
    assert recipients == {party: set(config.graph[party]) for party in range(1, 11)}


def test_two_parties_warn_and_still_aggregate() -> None:
    with pytest.warns(PrivacyWarning):
        config = make_config(2)
    result, inputs, encoded = run(config)
    check_result(result, config, inputs, encoded, {1, 2})


@pytest.mark.parametrize("modulus_bits", [32, 64])
def test_masked_inputs_look_uniform(modulus_bits: int) -> None:
    # All-zero inputs: whatever structure the server could see would come from the masks.
    config = make_config(4, modulus_bits=modulus_bits, dimension=1 << 14)
    masked: list[np.ndarray] = []

    def observe(message: Message) -> None:
        if isinstance(message, MaskedInput):
            masked.append(np.array(message.vector))

    # Weight 1 (a total weight of 0 would void the round); every other word is zero.
    zeros = config.encoder.encode(np.zeros(config.dimension), 1.0)
    simulate_round(config, lambda party: zeros.copy(), observe=observe)
    assert len(masked) == 4
    shift = masked[0].dtype.type(modulus_bits - 8)
    for vector in masked:
        # Top byte and bottom byte, 256 bins each. A false alarm has probability 1e-6 per check.
        for byte in (vector >> shift, vector & vector.dtype.type(0xFF)):
            counts = np.bincount(byte.astype(np.int64), minlength=256)
            assert stats.chisquare(counts).pvalue > 1e-6
    assert not np.array_equal(masked[0], masked[1])
