"""The collaborator's secure-aggregation steps: what they refuse beyond the protocol library's own checks."""

from __future__ import annotations

from typing import Any

import pytest

from fedfair.runtime.collaborator import steps
from fedfair.runtime.contract import TRAINING
from fedfair.secagg.messages import SurvivorSet
from tests.secagg.helpers import Harness, make_config

NO_PARTICIPANT: Any = None
"""The consistency step needs nothing of the participant."""


def work_at_consistency(view: steps.SignedView) -> tuple[steps.Work, SurvivorSet, Harness]:
    """Party 1 of a five-party round, masked and waiting to sign; every party masked."""
    harness = Harness(make_config(parties=5))
    survivor_set = harness.through_masking([1, 2, 3, 4, 5])
    work = steps.Work(1, TRAINING, None, 1.0, client=harness.clients[1], view=view)
    return work, survivor_set, harness


def test_an_input_signs_for_the_same_survivors_in_every_session() -> None:
    # A re-run round carrying the same input (the cache) shares one SignedView with the first session.
    view = steps.SignedView()
    work, survivor_set, harness = work_at_consistency(view)
    steps.consistency(NO_PARTICIPANT, work, survivor_set.to_bytes())
    assert view.survivors == frozenset(harness.config.parties)
    # The next session with the same survivors is signed again.
    again, same, _ = work_at_consistency(view)
    steps.consistency(NO_PARTICIPANT, again, same.to_bytes())


def test_an_input_already_signed_for_refuses_other_survivors() -> None:
    # The aggregator ran the round with party 5 and now (after a real or pretended crash) without it:
    # subtracting the two sums would give party 5's update, so the same input is not signed for both.
    view = steps.SignedView(survivors=frozenset({"site-1", "site-2", "site-3", "site-4"}))
    work, survivor_set, _ = work_at_consistency(view)
    with pytest.raises(steps.RoundRefused, match="already signed for with other survivors"):
        steps.consistency(NO_PARTICIPANT, work, survivor_set.to_bytes())
    assert view.survivors == frozenset({"site-1", "site-2", "site-3", "site-4"})
    assert work.client is not None and work.client.signed_view is None  # refused before anything was signed
