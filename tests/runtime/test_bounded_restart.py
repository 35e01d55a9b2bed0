"""A site restarted between SHARE and DECIDE of a bounded round answers its verdict record from what it kept (issue 94).

At the plug-in level, with a real restart of the collaborator's state: the round runs through the runtime's own
pieces (:func:`tests.runtime.test_bounded_round.run_round`: the aggregator's driver and server, the sites' steps, the
auditor's state, the federation's real certificates), and a restarted site is a new Participant made from the same
settings, with a new Work that holds nothing of the round: all it has of its SHARE is what its folder kept. As
processes, a site killed after its SHARE upload and started again: tests/runtime/test_bounded_settlement_processes.py.
"""

from __future__ import annotations

import dataclasses
import stat
import pytest

from fedfair.core.errors import Refusal, RefusedError, VerificationError, VerifyReason
from fedfair.runtime.collaborator.kinds.bounded import SiteRound
from fedfair.runtime.collaborator.kinds.bounded_settlement import kept_round, settlement_path
from fedfair.runtime.contract import ACCEPTED
from fedfair.secagg.bounded.record import RECORD_PREFIX, claimed_context
from fedfair.secagg.bounded.verifier import Role
from fedfair.secagg.bounded.verifying import RoundVerifier
from tests.runtime.forging_aggregator import frame
from tests.runtime.test_bounded_round import Federation, bounded, in_sum, run_round  # noqa: F401 (the fixture)
from tests.runtime.test_input_bound import federation  # noqa: F401 (the fixture)
from tests.runtime.test_manifest import COLLABORATORS

FRAMED = COLLABORATORS[1]
"""The site the aggregator frames: party 2 of the round's roster."""
RESTARTED = COLLABORATORS[0]
"""A site the record accepts, restarted between SHARE and DECIDE."""


def with_folders(bounded: Federation, without: tuple[str, ...] = ()) -> None:  # noqa: F811
    """Each site but `without` keeps its state in its folder (beside its key), as its process does; one without a
    folder keeps nothing."""
    for name, me in bounded.sites.items():
        bounded.sites[name] = dataclasses.replace(me, folder=None if name in without else bounded.folder / name)


def framing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aggregator's verifier message about party 2 of round 1 has its first output moved before it commits to it
    (tests/runtime/forging_aggregator.py's ``frame``): both verifiers reject its honest proof, and the verdict record's
    evidence, signed by both, names it a liar. Undone after the test."""
    monkeypatch.setattr(RoundVerifier, "receive_seed", RoundVerifier.receive_seed)  # what the teardown puts back
    frame(Role.LEADER)


def test_a_framed_site_restarted_between_share_and_decide_clears_itself_and_the_aggregator_is_named(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_folders(bounded)
    framing(monkeypatch)
    outcome = run_round(bounded, monkeypatch, restarted=(FRAMED,))
    assert outcome.config.party_id(FRAMED) == 2
    # Its dispute, made from the kept part, held at the aggregator's own check: the round is void, the site no culprit.
    assert outcome.server.framed() is not None and FRAMED in outcome.server.framed(), repr(outcome.verdicts)[:3000]
    assert outcome.server.culprits == {}
    stop = outcome.works[FRAMED].stop
    assert stop is not None and stop.reason is VerifyReason.FRAMED, outcome.verdicts
    assert "this site sent that part back as its dispute" in str(stop)
    for name in COLLABORATORS:
        if name == FRAMED:
            continue
        refused = outcome.verdicts[name]
        assert isinstance(refused, VerificationError) and refused.reason is VerifyReason.FRAMED, (name, refused)
        assert f"the aggregator framed {FRAMED}, whose proof checks with the true message" in str(refused)
    assert not settlement_path(bounded.sites[FRAMED]).exists()  # type: ignore[union-attr]  # answered: removed


def test_a_framed_site_that_kept_nothing_cannot_clear_itself_after_a_restart(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: a site without a folder keeps nothing, so restarted it withdraws, and the others name it a liar."""
    with_folders(bounded, without=(FRAMED,))
    framing(monkeypatch)
    outcome = run_round(bounded, monkeypatch, restarted=(FRAMED,))
    withdrawn = outcome.verdicts[FRAMED]
    assert isinstance(withdrawn, RefusedError) and withdrawn.reason is Refusal.WITHDRAWN, withdrawn
    assert outcome.server.framed() is None and set(outcome.server.culprits) == {2}
    for name in COLLABORATORS:
        if name != FRAMED:
            assert outcome.verdicts[name] == ACCEPTED, (name, outcome.verdicts[name])
            held = outcome.works[name].client
            assert isinstance(held, SiteRound) and [liar.party for liar in held.liars] == [FRAMED]


def test_a_restarted_site_the_record_accepts_tags_and_verifies_the_total_from_its_kept_part(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_folders(bounded)
    outcome = run_round(bounded, monkeypatch, restarted=(RESTARTED,))
    assert all(outcome.verdicts[name] == ACCEPTED for name in COLLABORATORS), outcome.verdicts
    in_sum(outcome, tuple(COLLABORATORS))
    assert not any(settlement_path(me).exists() for me in bounded.sites.values())  # type: ignore[union-attr]


def test_a_sites_settlement_is_kept_for_its_owner_alone_from_share_until_it_answers_the_record(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kept before the parts leave (the aggregator has them all when it sends the record), mode 0600, of the round
    and the site's own part: exactly what it sent the aggregator, and the auditor's share it sealed."""
    with_folders(bounded)
    seen = {}

    def at_decide(record: bytes, server: object) -> bytes:
        for name, me in bounded.sites.items():
            path = settlement_path(me)
            assert path is not None
            seen[name] = (stat.S_IMODE(path.stat().st_mode), kept_round(me))
        return record

    outcome = run_round(bounded, monkeypatch, record=at_decide)
    assert all(outcome.verdicts[name] == ACCEPTED for name in COLLABORATORS), outcome.verdicts
    for name, (mode, kept) in seen.items():
        assert mode == 0o600, (name, oct(mode))
        assert kept is not None and kept.round == 1
        held = outcome.works[name].client
        assert isinstance(held, SiteRound)
        assert kept.settlement.to_bytes() == held.site.settlement().to_bytes(), name
        assert kept.settlement.upload.party == outcome.config.party_id(name)
    assert not any(settlement_path(me).exists() for me in bounded.sites.values())  # type: ignore[union-attr]


def test_a_damaged_settlement_is_a_withdrawal_naming_the_file(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def damaged(record: bytes, server: object) -> bytes:
        path = settlement_path(bounded.sites[RESTARTED])
        assert path is not None
        path.write_bytes(path.read_bytes()[:-5])
        return record

    with_folders(bounded)
    outcome = run_round(bounded, monkeypatch, record=damaged, restarted=(RESTARTED,))
    refused = outcome.verdicts[RESTARTED]
    assert isinstance(refused, RefusedError) and refused.reason is Refusal.WITHDRAWN
    assert f"{RESTARTED}." in str(refused) and "is damaged" in str(refused), refused


def test_a_restarted_site_sent_a_record_of_another_run_of_its_round_withdraws(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The record names the digest of the context it is of (its signature binds the real one, so a site that shared
    in this process reads past a wrong name): one naming another run (another session) than the kept part's is not
    the round the site shared in, so the restarted site withdraws, its update in no sum of that run, rather than refuse
    the record as forged. The round is then void for want of its tags."""

    def of_another_run(record: bytes, server: object) -> bytes:
        moved = bytearray(record)
        moved[8 + len(RECORD_PREFIX) + 8] ^= 1  # the first byte of the context digest the body names
        assert claimed_context(bytes(moved)) != claimed_context(record)
        return bytes(moved)

    with_folders(bounded)
    outcome = run_round(bounded, monkeypatch, record=of_another_run, restarted=(RESTARTED,))
    refused = outcome.verdicts[RESTARTED]
    assert isinstance(refused, RefusedError) and refused.reason is Refusal.WITHDRAWN, refused
    assert "another run of round 1 than the one this site shared in" in str(refused)
    assert set(outcome.verdicts) == {RESTARTED}, outcome.verdicts  # the others tagged it
    withheld = outcome.server.tags_withheld()
    assert withheld is not None and RESTARTED in withheld, withheld
