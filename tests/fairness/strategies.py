"""Hypothesis strategies shared by the fairness tests: synthetic per-sample losses and group sizes.

Synthetic loss vectors are used only to test the math: the metrics are functions of
per-sample numbers, whatever model produced them.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

# Losses with many ties (a few repeated values) as well as spread-out ones: ties are
# where the fractional boundary weight and the strict count l > c matter.
loss_values = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 3.0]), st.floats(0.0, 20.0, allow_nan=False))
loss_vectors = st.lists(loss_values, min_size=1, max_size=60).map(lambda values: np.array(values, dtype=np.float64))
rhos = st.one_of(st.sampled_from([1.0, 0.5, 0.1, 0.3]), st.floats(0.01, 1.0))


def scale(values: np.ndarray) -> float:
    """1 + the largest magnitude: the unit in which float64 rounding of these values is measured."""
    return 1.0 + float(np.abs(values).max())
