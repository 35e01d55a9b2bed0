"""A bounded round run again is totalled over the same sites or not at all (issue 80).

An aggregator that restarts runs its round again, and every site sends its kept input again. Two totals of those
inputs over different sites (one site's part dropped in one run) would differ by that site's input, so the auditor
withholds the second total (:meth:`AuditorRounds._check_rerun`); the aggregator then has no sum, and no site is
asked to decide on one. A run again over the same sites is totalled again: its sum tells nothing new.
"""

from __future__ import annotations

from typing import Any

import pytest

from fedfair.core.errors import ProtocolError
from fedfair.runtime.contract import ACCEPTED
from fedfair.secagg.round import StageSpec
from tests.runtime.test_auditor_rounds import at, rounds_of
from tests.runtime.test_bounded_round import Federation, bounded, in_sum, run_round  # noqa: F401 (the fixture)
from tests.runtime.test_input_bound import federation  # noqa: F401 (the fixture)
from tests.runtime.test_manifest import COLLABORATORS


def test_a_round_run_again_over_other_sites_gets_no_total(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rounds = rounds_of(bounded)

    def auditor(spec: StageSpec, inputs: bytes) -> Any:
        return rounds.step(at(spec.stage), inputs)

    first = run_round(bounded, monkeypatch, auditor=auditor)
    assert first.verdicts == dict.fromkeys(COLLABORATORS, ACCEPTED)
    in_sum(first, COLLABORATORS)
    again = run_round(bounded, monkeypatch, auditor=auditor)  # the same sites: the same sum, totalled again
    in_sum(again, COLLABORATORS)
    with pytest.raises(ProtocolError, match="round 1 was totalled before over hospital-a, hospital-b, hospital-c"):
        run_round(bounded, monkeypatch, auditor=auditor, lost="hospital-b")
    assert rounds.verified == [1, 1] and rounds.current is None


def test_without_the_auditors_total_no_site_is_asked_to_decide(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rounds = rounds_of(bounded)
    run_round(bounded, monkeypatch, auditor=lambda spec, inputs: rounds.step(at(spec.stage), inputs))

    def withholding(spec: StageSpec, inputs: bytes) -> Any:
        try:
            return rounds.step(at(spec.stage), inputs)
        except ProtocolError:
            return None  # its process withdraws: the aggregator receives nothing

    with pytest.raises(ProtocolError, match="the auditor's total has not arrived: no site decides"):
        run_round(bounded, monkeypatch, auditor=withholding, lost="hospital-b")
