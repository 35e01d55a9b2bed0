"""What the aggregator keeps of applied training rounds for a site that missed one (issue 98)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.runtime.aggregator.past_rounds import KEPT_ROUNDS, PastRounds
from fedfair.runtime.output_folder import PAST_ROUNDS_NAME
from fedfair.runtime.transport import pb
from fedfair.secagg import config as config_module
from tests.secagg.helpers import Harness, make_config

ROSTER = ("site-a", "site-b", "site-c")


def binding(round_number: int, step: int, stage: pb.Stage = pb.STAGE_TRAIN) -> pb.Binding:
    return pb.Binding(federation_id="f", round=round_number, stage=stage, step=step)


def run_round(kept: PastRounds, round_number: int, applied: bool = True, verified_by: tuple[str, ...] = ()) -> None:
    """A round's stages open with their inputs: shared ones at steps 1 and 6, a per-party one at step 3."""
    kept.opened(binding(round_number, 1), b"parameters %d" % round_number)
    kept.opened(binding(round_number, 3), {"site-a": b"bundle for site-a"})
    kept.opened(binding(round_number, 6), b"claim %d" % round_number)
    kept.opened(binding(round_number, 1, pb.STAGE_EVALUATE), b"an evaluation's")
    kept.ended(round_number, applied, verified_by, ROSTER)


def test_an_applied_rounds_shared_inputs_are_served_and_nothing_else(tmp_path: Path) -> None:
    kept = PastRounds(tmp_path)
    kept.opened(binding(1, 1), b"parameters 1")
    assert kept.input(binding(1, 1)) is None  # under way: not served until it applies
    kept.opened(binding(1, 6), b"claim 1")
    kept.opened(binding(1, 6), b"claim 1, the stage re-opened")  # a repeated stage's last input stands
    kept.ended(1, True, ("site-a",), ROSTER)
    assert kept.input(binding(1, 1)) == b"parameters 1"
    assert kept.input(binding(1, 6)) == b"claim 1, the stage re-opened"
    run_round(kept, 2)
    assert kept.input(binding(2, 3)) is None  # addressed to one party: never kept
    assert kept.input(binding(2, 1, pb.STAGE_EVALUATE)) is None
    assert kept.input(binding(2, 0)) is None
    assert kept.kept() == [1, 2]


def test_an_aborted_round_is_not_kept(tmp_path: Path) -> None:
    kept = PastRounds(tmp_path)
    run_round(kept, 1, applied=False)
    assert kept.kept() == [] and kept.input(binding(1, 1)) is None
    assert not any((tmp_path / "past-rounds").iterdir())


def test_a_round_every_site_verified_or_passed_is_removed(tmp_path: Path) -> None:
    kept = PastRounds(tmp_path)
    run_round(kept, 1, verified_by=("site-a", "site-b"))
    run_round(kept, 2, verified_by=("site-a", "site-b"))
    assert kept.kept() == [1, 2]  # site-c verified neither
    run_round(kept, 3, verified_by=("site-a", "site-c"))
    assert kept.kept() == [3]  # site-b verified round 2, site-c round 3: every site holds rounds 1 and 2
    run_round(kept, 4, verified_by=ROSTER)
    assert kept.kept() == []


def test_at_most_the_newest_rounds_are_kept(tmp_path: Path) -> None:
    kept = PastRounds(tmp_path)
    for round_number in range(1, KEPT_ROUNDS + 4):
        run_round(kept, round_number, verified_by=("site-a",))
    assert kept.kept() == list(range(4, KEPT_ROUNDS + 4))


def test_a_round_run_again_starts_afresh(tmp_path: Path) -> None:
    """A resumed aggregator re-runs the round it died in: what that round's first attempt wrote is gone."""
    kept = PastRounds(tmp_path)
    kept.opened(binding(1, 1), b"first attempt")
    kept.opened(binding(1, 6), b"first attempt's claim")
    kept.opened(binding(1, 1), b"second attempt")
    kept.ended(1, True, (), ROSTER)
    assert kept.input(binding(1, 1)) == b"second attempt" and kept.input(binding(1, 6)) is None
    # Applied, then the aggregator died before its checkpoint: the round runs again, and its kept inputs are not
    # served in place of the stages now open.
    kept.opened(binding(1, 1), b"third attempt")
    assert kept.input(binding(1, 1)) is None and kept.kept() == []


def test_without_a_folder_nothing_is_kept(tmp_path: Path) -> None:
    kept = PastRounds(None)
    run_round(kept, 1)
    assert kept.kept() == [] and kept.input(binding(1, 1)) is None


def test_a_resumed_aggregator_serves_the_rounds_kept_before(tmp_path: Path) -> None:
    run_round(PastRounds(tmp_path), 1)
    resumed = PastRounds(tmp_path)
    assert resumed.kept() == [1] and resumed.keeps(binding(1, 1)) and resumed.input(binding(1, 1)) == b"parameters 1"
    assert not resumed.keeps(binding(2, 1)) and not resumed.keeps(binding(1, 1, pb.STAGE_EVALUATE))
    assert not resumed.keeps(binding(1, 0))


PARTIES, DIMENSION = 4, 20_000


def masked_round_inputs(above_the_bound: bool, untagged: int) -> tuple[list[bytes], int]:
    """What every survivor of a verified masked round of PARTIES was sent, as kept (key directory, survivor set,
    unmask request, claim, tag set), with `untagged` survivors' tags missing; and the bytes of one model (d + 1 words).
    """
    with pytest.MonkeyPatch.context() as patch:
        if above_the_bound:
            patch.setattr(config_module, "RESUMMED_WORDS", 0)
        # No colluder allowed: one claim for every survivor, the one kept (a re-checked round's claims are each
        # survivor's own, and none is kept).
        harness = Harness(make_config(PARTIES, dimension=DIMENSION, max_colluding=0), verified=True)
        everyone = list(range(1, PARTIES + 1))
        survivor_set = harness.through_masking(everyone)
        harness.sign(survivor_set)
        request = harness.server.unmask_request()
        harness.unmask(request)
        harness.server.finish()
        claim = harness.server.claim()
        for party in everyone[untagged:]:
            harness.server.receive_tag(harness.clients[party].tag(claim))
        tag_set = harness.server.tag_set()
    assert harness.directory is not None
    messages = (harness.directory, survivor_set, request, claim, tag_set)
    return [message.to_bytes() for message in messages], (DIMENSION + 1) * claim.vector.itemsize


@pytest.mark.parametrize(
    ("above_the_bound", "untagged", "models"), [(False, 0, PARTIES + 1), (True, 0, 1), (True, 1, PARTIES + 1)]
)
def test_a_kept_round_is_the_size_operations_md_gives(
    tmp_path: Path, above_the_bound: bool, untagged: int, models: int
) -> None:
    """docs/operations.md, `past-rounds/`: a kept round is its claimed sum, every survivor's masked input beside it
    where a survivor re-sums it (below the re-sum bound the claim carries them; above it, in a round whose tags did
    not all arrive, the tag set does, and a site catching up needs them), and under 4 KiB a site besides."""
    inputs, model = masked_round_inputs(above_the_bound, untagged)
    kept = PastRounds(tmp_path)
    for step, data in enumerate(inputs, start=1):
        kept.opened(binding(1, step), data)
    kept.ended(1, True, (), ROSTER)
    size = sum(path.stat().st_size for path in (tmp_path / PAST_ROUNDS_NAME / "1").iterdir())
    assert models * model <= size <= models * model + 4096 * PARTIES, (size, model)
