"""The aggregator's start and goodbye: how long it keeps serving collaborators after FINISHED."""

from __future__ import annotations

import pytest

from fedfair.runtime.aggregator.start import BUNDLE_FETCH_BYTES_PER_SECOND, GOODBYE_SECONDS, goodbye_seconds


def test_the_goodbye_outlasts_every_collaborators_bundle_fetch() -> None:
    """At d = 10^8 three sites fetched a 400 MB bundle each; the fixed 10 s goodbye cut them off mid-fetch."""
    bundle = 4 * 10**8  # float32 theta-bar of 10^8 parameters
    wait = goodbye_seconds(bundle, 3)
    assert wait == pytest.approx(GOODBYE_SECONDS + 3 * bundle / BUNDLE_FETCH_BYTES_PER_SECOND)
    assert wait >= 60  # 1.2 GB at 20 MB/s, beside the 10 s to read FINISHED
    assert goodbye_seconds(bundle, 4) > wait > goodbye_seconds(bundle // 2, 3)


def test_a_small_federation_waits_the_fixed_goodbye() -> None:
    """A logistic regression's bundle (a few KB) adds milliseconds: the goodbye stays what it was."""
    assert goodbye_seconds(0, 51) == GOODBYE_SECONDS
    assert GOODBYE_SECONDS < goodbye_seconds(20_000, 51) < GOODBYE_SECONDS + 0.1
