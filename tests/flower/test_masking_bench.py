"""benchmarks/flower_masking.py's Flower side: Flower's SecAgg+ on its in-process grid, at a small d."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from flower_masking import Quantisation, flower_side  # noqa: E402


def test_the_flower_side_unmasks_the_mean_within_a_step_and_sends_64_bits_a_coordinate() -> None:
    dimension, parties = 2000, 3
    quantisation = Quantisation(levels=640, threshold=2)  # fedfair's at n = 3 (16-bit words, clip 0.05, weight 100)
    result = flower_side(dimension, parties, rounds=2, quantisation=quantisation)
    # Each site's stochastic rounding is under one step and the weights are equal: the mean is within a step (the
    # run refuses more itself), and the rounding makes it not exact.
    assert 0 < result["mean_error"] <= quantisation.step
    # The masked vector travels as int64 whatever the modulus: 8 bytes a coordinate and site, plus keys and framing.
    assert 8 * dimension * parties < result["bytes_up"] < 8 * dimension * parties * 1.2
    # The fit instruction carries the float32 model to each site: at least 4 bytes a coordinate and site down.
    assert result["bytes_down"] > 4 * dimension * parties
    assert result["party_cpu_seconds"] > 0 and result["server_cpu_seconds"] > 0
