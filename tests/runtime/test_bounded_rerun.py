"""The same inputs are totalled over the same sites or not at all (issue 80).

An aggregator that restarts runs its round again, and every site sends its kept input again; so does a later round
on the model a void round left (a site lost before its tags at DECIDE). Two totals of those inputs over different
sites (one site's part dropped in one of them) would differ by that site's input, so the auditor withholds the
second total (:meth:`AuditorRounds._check_inputs_totalled_before`); the aggregator then has no sum, and no site is
asked to decide on one. The same inputs over the same sites are totalled again, with the same noise (its key
derives from the round and the auditor's kept secret): the sum tells nothing new. The first total's sites are kept
in the auditor's folder, so an auditor restarted in between withholds it too. Under distributed DP each round's
inputs are trained afresh and charged, so a later round is held to nobody's sites.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from fedfair.core.errors import ConfigError, ProtocolError
from fedfair.runtime.auditor.totals import (
    NOISE_SECRET_NAME,
    TOTALS_NAME,
    FirstTotals,
    NoiseKeys,
    TotalledRound,
)
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
    with pytest.raises(
        ProtocolError, match="round 1's inputs were totalled in round 1 over hospital-a, hospital-b, hospital-c"
    ):
        run_round(bounded, monkeypatch, auditor=auditor, lost=("hospital-b",))
    assert rounds.verified == [1, 1] and rounds.current is None


def test_a_restarted_auditor_still_withholds_a_total_over_other_sites(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = rounds_of(bounded)
    first = run_round(bounded, monkeypatch, auditor=lambda spec, inputs: before.step(at(spec.stage), inputs))
    in_sum(first, COLLABORATORS)
    restarted = rounds_of(bounded)  # a new process over the same folder: nothing of `before` in memory
    assert restarted.verified == []

    def auditor(spec: StageSpec, inputs: bytes) -> Any:
        return restarted.step(at(spec.stage), inputs)

    with pytest.raises(
        ProtocolError, match="round 1's inputs were totalled in round 1 over hospital-a, hospital-b, hospital-c"
    ):
        run_round(bounded, monkeypatch, auditor=auditor, lost=("hospital-b",))
    in_sum(run_round(bounded, monkeypatch, auditor=auditor), COLLABORATORS)  # the same sites: totalled again


def test_a_later_round_on_a_void_rounds_model_is_held_to_its_sites_unless_inputs_are_noised(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Round 1 is totalled over every site, then void (a site lost before its tags): the model stays, so round 2 sends
    the same kept inputs, and a total over fewer sites would be round 1's less the lost one's input."""
    rounds = rounds_of(bounded)

    def auditor_at(round_number: int) -> Any:
        return lambda spec, inputs: rounds.step(at(spec.stage, round_number), inputs)

    in_sum(run_round(bounded, monkeypatch, auditor=auditor_at(1)), COLLABORATORS)
    with pytest.raises(ProtocolError, match="round 2's inputs were totalled in round 1 over hospital-a, hospital-b, h"):
        run_round(bounded, monkeypatch, auditor=auditor_at(2), lost=("hospital-c",), round_number=2)
    in_sum(run_round(bounded, monkeypatch, auditor=auditor_at(3), round_number=3), COLLABORATORS)  # the same sites
    assert rounds.verified == [1, 3]
    # Under distributed DP each round's inputs are their own (trained afresh, charged): only the same round is held.
    first = TotalledRound("fed", 1, "a" * 64, frozenset(COLLABORATORS))
    later = TotalledRound("fed", 2, "a" * 64, frozenset(COLLABORATORS[:2]))
    noised = FirstTotals(tmp_path, fresh_each_round=True)
    assert noised.first(first) == first and noised.first(later) == later
    assert noised.first(dataclasses.replace(later, sites=frozenset())) == later  # round 2 again: its own first
    assert FirstTotals(tmp_path, fresh_each_round=False).first(later) == first  # read back: held to round 1's


def test_the_kept_totals_name_the_federation_round_model_and_sites(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rounds = rounds_of(bounded)
    run_round(bounded, monkeypatch, auditor=lambda spec, inputs: rounds.step(at(spec.stage), inputs))
    [kept] = json.loads(rounds.totals.path.read_text())
    assert kept["federation_id"] == rounds.shared.federation_id and kept["round"] == 1, kept
    assert kept["sites"] == sorted(COLLABORATORS) and len(kept["model"]) == 64, kept


def test_a_damaged_totals_file_stops_the_auditor_naming_it(bounded: Federation) -> None:  # noqa: F811
    path = rounds_of(bounded).totals.path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('[{"round": 1}]')
    with pytest.raises(ConfigError, match=f"{path}: not a list of totalled rounds .*restore it from a backup"):
        rounds_of(bounded)


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
        run_round(bounded, monkeypatch, auditor=withholding, lost=("hospital-b",))


def test_a_round_whose_share_stage_timed_out_below_the_floor_keeps_no_total_and_blocks_no_later_round(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 94: SHARE timed out with one site's share of three (under the plan's threshold of 2). Before the floor
    the auditor kept an empty total for round 1, and every later round on its model was refused as other sites; now
    it withdraws at TOTAL, keeps no total, and round 2 on the same model is totalled over every site."""
    rounds = rounds_of(bounded)

    def withdrawing(round_number: int) -> Any:
        def auditor(spec: StageSpec, inputs: bytes) -> Any:
            try:
                return rounds.step(at(spec.stage, round_number), inputs)
            except ProtocolError:
                rounds.leave(round_number)  # as its process does: it withdraws and uploads nothing
                raise

        return auditor

    with pytest.raises(ProtocolError, match="BELOW_FLOOR: .*covers 1 accepted input"):
        run_round(bounded, monkeypatch, auditor=withdrawing(1), lost=("hospital-b", "hospital-c"))
    assert json.loads(rounds.totals.path.read_text()) == [] and rounds.current is None and rounds.verified == []
    in_sum(run_round(bounded, monkeypatch, auditor=withdrawing(2), round_number=2), COLLABORATORS)
    assert [kept["round"] for kept in json.loads(rounds.totals.path.read_text())] == [2]


def test_the_noise_key_of_a_round_survives_a_restart_and_names_its_round(tmp_path: Path) -> None:
    """A round run again after a restart gets its first run's noise key; another round or model gets another."""
    keys = NoiseKeys(tmp_path)
    key = keys.key("fed", 1, "a" * 64)
    assert len(key) == 32 and NoiseKeys(tmp_path).key("fed", 1, "a" * 64) == key
    others = {keys.key("fed", 2, "a" * 64), keys.key("fed", 1, "b" * 64), keys.key("other", 1, "a" * 64)}
    assert key not in others and len(others) == 3
    assert NoiseKeys(tmp_path / "elsewhere").key("fed", 1, "a" * 64) != key  # another auditor's secret
    secret = tmp_path / NOISE_SECRET_NAME
    assert secret.stat().st_mode & 0o777 == 0o600
    secret.write_bytes(b"short")
    with pytest.raises(ConfigError, match=f"{secret}: not a 32-byte secret; .*restore it from a backup"):
        NoiseKeys(tmp_path)


def test_an_auditor_folder_that_lost_its_secret_or_its_totals_is_refused_naming_the_file(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the issue 93 red team: an auditor whose folder lost `noise.secret` made a new one at its next start, so
    a round the aggregator ran again was noised afresh (two draws averaged: 0.502 of the charged variance left in the
    in-process round); one that lost `totals.json` would total it over other sites. Either half alone is refused."""
    fresh = rounds_of(bounded)
    folder = fresh.totals.path.parent
    assert json.loads((folder / TOTALS_NAME).read_text()) == [] and (folder / NOISE_SECRET_NAME).exists()
    (folder / NOISE_SECRET_NAME).unlink()
    rounds_of(bounded)  # nothing totalled yet: a secret made afresh noises no total twice
    rounds = rounds_of(bounded)
    in_sum(
        run_round(bounded, monkeypatch, auditor=lambda spec, inputs: rounds.step(at(spec.stage), inputs)), COLLABORATORS
    )
    secret, totals = folder / NOISE_SECRET_NAME, folder / TOTALS_NAME
    kept = secret.read_bytes()
    secret.unlink()
    missing = f"{secret} is missing beside {totals}, which records totals .*restore the folder's {NOISE_SECRET_NAME}"
    with pytest.raises(ConfigError, match=re.escape(f"{secret} is missing beside {totals}")) as refused:
        rounds_of(bounded)
    assert re.search(missing, str(refused.value)) and not secret.exists()
    secret.write_bytes(kept)
    secret.chmod(0o600)
    totals.unlink()
    with pytest.raises(ConfigError, match=re.escape(f"{totals} is missing beside {secret}")):
        rounds_of(bounded)
