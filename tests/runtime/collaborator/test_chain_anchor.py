"""The chain never breaks silently (issue 79): round 1 is the plan's initial model, the anchor outlives a restart, a
model the site cannot check is sat out, and a verified sum outside the aggregator's bounds makes no model."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedfair.core import server
from fedfair.core.errors import RoundAbortedError, VerificationError, VerifyReason
from fedfair.runtime import state_files
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.aggregator.checks import SumOutcome, check_agreed_influence, check_decoded_update
from fedfair.runtime.collaborator import chain as model_chain
from fedfair.runtime.collaborator import chain_record
from fedfair.core.errors import UncheckedModelError
from fedfair.runtime.collaborator.chain import ModelChain
from fedfair.runtime.collaborator.chain_record import Anchor
from fedfair.runtime.state_files import HeldState
from fedfair.runtime.collaborator.outcome import OutcomeRecord
from fedfair.core.update import update_dimension
from fedfair.runtime.contract import model_download
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import (
    AggregatorPlan,
    SharedSettings,
    load_aggregator_plan,
    load_shared_settings,
    shared_settings,
)
from fedfair.secagg import Encoder

NAMES = ("site-a", "site-b", "site-c")

Model = tuple[np.ndarray, float, None]


@dataclasses.dataclass
class Federation:
    """A secure plan, a site's copy of it, round 0's state, and the aggregator's own honest rounds."""

    plan: AggregatorPlan
    shared: SharedSettings
    start: server.ServerState

    def encoder(self, round_number: int) -> Encoder:
        shared, length = self.shared, update_dimension(self.start.theta.numel(), corrects_drift=False)
        return Encoder(shared.training_encoding(shared.federation_id, len(NAMES), round_number, length), len(NAMES))

    def summed(self, round_number: int, scale: float = 0.01, weights: list[float] | None = None) -> np.ndarray:
        """Round `round_number`'s encoded sum of three updates of values in [-scale, scale] (each site's weight)."""
        encoder, length = self.encoder(round_number), update_dimension(self.start.theta.numel(), corrects_drift=False)
        agreed = [self.plan.influence.weight_of(name, self.plan.batch_fraction) for name in NAMES]
        generator = np.random.default_rng(round_number)
        inputs = [encoder.encode(generator.uniform(-scale, scale, length), w) for w in weights or agreed]
        return np.sum(inputs, axis=0, dtype=inputs[0].dtype)  # modulo 2^k, as the masks cancel

    def stepped(self, state: server.ServerState, words: np.ndarray, round_number: int) -> server.ServerState:
        """The state the aggregator makes of `words`: its own checks first (RoundAbortedError: the round is void)."""
        decoded = self.encoder(round_number).decode(words, len(NAMES))
        outcome = SumOutcome(decoded.weighted_sum, decoded.total_weight, decoded.error_bound, NAMES)
        check_decoded_update(outcome, decoded.clip, len(NAMES))
        parameters = state.theta.numel()
        agreed = check_agreed_influence(outcome, self.plan.influence, self.plan.batch_fraction, parameters)
        aggregate = server.Aggregate.from_vector(torch.from_numpy(decoded.weighted_sum), agreed)
        average_from = self.plan.training.average_from_round
        return self.plan.algorithm().server_apply(state, aggregate, average_from=average_from)

    def chain(self, folder: Path | None = None) -> ModelChain:
        """A site's chain, its initial model built as the aggregator builds it (the plan's seed)."""
        return ModelChain("site-a", self.shared, folder, initial=lambda: self.start.theta)


def sent(state: server.ServerState) -> Model:
    """The model of `state` as a TRAIN download carries it (a built-in model: float32)."""
    return model_download(state.theta.numpy(), builtin=True), state.c, None


def backdoored(model: Model, where: int = 0, by: float = 1.0) -> Model:
    theta = model[0].copy()
    theta[where] += np.float32(by)
    return theta, model[1], None


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    plan = load_aggregator_plan(make_workspace(tmp_path_factory.mktemp("anchor"), NAMES).plan)
    assert plan.secure_aggregation.enabled
    return Federation(plan, load_shared_settings(shared_settings(plan)), initial_state(plan))


def restarted_anchor(federation: Federation, folder: Path) -> Anchor:
    """The anchor a site restarted on `folder` takes up: read, its logged sums stepped again."""
    anchor = federation.chain(folder).anchor
    assert anchor is not None
    return anchor


def two_rounds(federation: Federation, chain: ModelChain) -> server.ServerState:
    """`chain` takes round 1's model, verifies round 1's sum and takes round 2's model; round 2's state."""
    chain.sent(1, *sent(federation.start))
    words = federation.summed(1)
    chain.verified(1, words, NAMES, federation.encoder(1))
    moved = federation.stepped(federation.start, words, 1)
    chain.sent(2, *sent(moved))
    return moved


def test_round_1_takes_only_the_plans_initial_model_as_this_site_builds_it(federation: Federation) -> None:
    with pytest.raises(VerificationError) as caught:
        federation.chain().sent(1, *backdoored(sent(federation.start)))  # +1.0 on one weight: a backdoor
    assert caught.value.reason is VerifyReason.INITIAL_MODEL and caught.value.round == 1
    assert f"1 of {federation.start.theta.numel()} values differ, the largest by 1" in str(caught.value)
    federation.chain().sent(1, *sent(federation.start))
    with pytest.raises(UncheckedModelError, match="no initial model of its own"):  # never taken as sent
        ModelChain("site-a", federation.shared).sent(1, *sent(federation.start))


def test_the_anchor_outlives_a_restart_and_refuses_a_forged_model_after_it(
    federation: Federation, tmp_path: Path
) -> None:
    chain = federation.chain(tmp_path)
    state = two_rounds(federation, chain)
    words = federation.summed(2)
    chain.verified(2, words, NAMES, federation.encoder(2))
    moved = federation.stepped(state, words, 2)
    assert chain.path is not None and chain.path.exists()
    for model, verdict in ((backdoored(sent(moved), 5), "refused"), (sent(moved), "taken"), (sent(state), "void")):
        restarted = federation.chain(tmp_path)  # a new process: nothing in memory
        if verdict == "refused":
            with pytest.raises(VerificationError) as caught:
                restarted.sent(3, *model)
            assert caught.value.reason is VerifyReason.NEXT_MODEL and caught.value.round == 3
        else:
            restarted.sent(3, *model)  # the step of round 2's verified sum, or (round 2 void) the model before
            assert restarted.unchecked_from is None


def test_a_restart_without_an_anchor_sits_out_every_model_but_the_initial_one(
    federation: Federation, tmp_path: Path
) -> None:
    state = two_rounds(federation, federation.chain())  # kept nothing on disk (no folder)
    restarted = federation.chain(tmp_path)
    with pytest.raises(UncheckedModelError, match="holds no model it checked before this one, nor the initial"):
        restarted.sent(2, *sent(state))
    with pytest.raises(UncheckedModelError, match="nor the initial"):  # nor a backdoored initial model
        restarted.sent(2, *backdoored(sent(federation.start)))
    assert restarted.unchecked_from == 2
    restarted.sent(1, *sent(federation.start))  # round 1 run again: its model is still the plan's
    # Every round since round 1 void: the plan's initial model is still the one to train on, and checked as such.
    again = federation.chain(tmp_path)
    again.sent(3, *sent(federation.start))
    assert again.anchor is not None and again.anchor.round == 3 and again.unchecked_from is None


def test_a_skipped_round_then_a_forged_model_is_sat_out_and_the_model_checked_is_taken_again(
    federation: Federation,
) -> None:
    chain = federation.chain()
    state = two_rounds(federation, chain)
    # Round 2 skipped (no sum verified), round 3 sent a backdoored model: not trained on, the round sat out.
    with pytest.raises(UncheckedModelError, match="did not verify round 2's sum") as caught:
        chain.sent(3, *backdoored(sent(state)))
    assert caught.value.round == 3 and chain.unchecked_from == 3
    words = federation.summed(1)
    chain.sent(4, *sent(state))  # every round since void: the model it checked
    # A gap after a verified sum: rounds 5 and 6 never seen; only that sum's step or the model before is taken.
    chain.verified(4, words, NAMES, federation.encoder(4))
    with pytest.raises(UncheckedModelError, match="no sum of round 5 to 6 since"):
        chain.sent(7, *backdoored(sent(state)))
    chain.sent(7, *sent(state))


def test_an_evaluation_of_a_model_this_site_did_not_make_is_sat_out(federation: Federation) -> None:
    chain = federation.chain()
    state = two_rounds(federation, chain)
    output = model_download(state.theta_average.numpy(), builtin=True)
    forged = backdoored((output, 0.0, None))[0]
    with pytest.raises(UncheckedModelError, match="last checked the model of round 2, not of training round 3, and"):
        chain.evaluated(3, forged, state.c_average)
    with pytest.raises(UncheckedModelError, match="did not verify round 2's sum"):
        chain.evaluated(2, forged, state.c_average)
    # Round 3 void before its model was sent: its evaluation is of the model this site checked for round 2.
    chain.evaluated(3, output, state.c_average)
    with pytest.raises(UncheckedModelError, match="last checked the model of round 2, not of training round 1"):
        chain.evaluated(1, output, state.c_average)


@pytest.mark.parametrize("breach", ["weight", "norm"])
def test_a_verified_sum_outside_the_aggregators_bounds_makes_no_model(federation: Federation, breach: str) -> None:
    """A sum the aggregator's own checks void: the site applies no step of it, and refuses a model made of it."""
    agreed = [federation.plan.influence.weight_of(name, federation.plan.batch_fraction) for name in NAMES]
    clip = federation.encoder(2).config.clip
    words = (
        federation.summed(2, weights=[agreed[0] * 4.0, *agreed[1:]])  # a weight of its own: 3 times more influence
        if breach == "weight"
        else federation.summed(2, scale=clip)  # each coordinate in the clip box, the update far past update_norm
    )
    chain = federation.chain()
    state = two_rounds(federation, chain)
    with pytest.raises(RoundAbortedError):  # the premise: the aggregator voids this round
        federation.stepped(state, words, 2)
    chain.verified(2, words, NAMES, federation.encoder(2))
    assert chain.anchor is not None and chain.anchor.next is None
    assert ("agrees for the contributors" if breach == "weight" else "update_norm") in chain.anchor.void
    decoded = federation.encoder(2).decode(words, len(NAMES))
    total = federation.plan.influence.total_weight(NAMES, federation.plan.batch_fraction)
    aggregate = server.Aggregate.from_vector(torch.from_numpy(decoded.weighted_sum), total)
    forged = federation.plan.algorithm().server_apply(state, aggregate)  # the step the aggregator should not take
    with pytest.raises(VerificationError) as caught:
        chain.sent(3, *sent(forged))
    assert caught.value.reason is VerifyReason.OUT_OF_BOUNDS and caught.value.round == 3
    chain.sent(3, *sent(state))  # the round void: the model before


def test_an_anchor_in_a_file_reads_back_bit_for_bit(
    federation: Federation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_files, "IN_FILE_FROM", 0)  # every state in a file, read by pieces of 8
    monkeypatch.setattr(state_files, "PIECE", 8)
    monkeypatch.setattr(chain_record, "_READ", 5)
    chain = federation.chain(tmp_path)
    state = two_rounds(federation, chain)
    chain.verified(2, federation.summed(2), NAMES, federation.encoder(2))
    assert chain.anchor is not None and chain.anchor.next is not None and chain.path is not None
    anchor = restarted_anchor(federation, tmp_path)
    assert anchor.state.in_file and anchor.next is not None and (anchor.round, anchor.verified) == (2, True)
    for kept, wanted in ((anchor.state, chain.anchor.state), (anchor.next, chain.anchor.next)):
        assert (kept.round, kept.c, kept.c_average, kept.fields) == (
            wanted.round,
            wanted.c,
            wanted.c_average,
            wanted.fields,
        )
        for field in kept.fields:
            length = kept.dimension + (field in ("control", "velocity"))
            assert all(
                np.array_equal(kept.values(field, a, b), wanted.values(field, a, b)) for a, b in kept.spans(length)
            )
    assert np.array_equal(anchor.state.values("theta", 0, 8), state.theta.numpy()[:8])


def kept_files_of(chain: ModelChain) -> dict[str, tuple[int, int]]:
    """The files beside `chain`'s anchor (states written whole, logged sums): each one's (inode, size), by name."""
    assert chain.path is not None
    stem, suffixes = chain.path.name.removesuffix(".npz"), (chain_record.STATE_SUFFIX, chain_record.SUM_SUFFIX)
    found = [path for suffix in suffixes for path in chain.path.parent.glob(f"{stem}.*{suffix}")]
    return {path.name: (path.stat().st_ino, path.stat().st_size) for path in found}


def same_bits(kept: HeldState, state: server.ServerState) -> bool:
    """Whether `kept` is `state` bit for bit: its scalars and every value of every tensor."""
    scalars = ("round", "c", "c_average", "averaged_rounds")
    if [getattr(kept, name) for name in scalars] != [getattr(state, name) for name in scalars]:
        return False
    fields = tuple(field for field in kept.fields if getattr(state, field) is not None)
    return fields == kept.fields and all(
        kept.values(field, 0, getattr(state, field).numel()).tobytes() == getattr(state, field).numpy().tobytes()
        for field in fields
    )


@pytest.fixture(params=[False, True], ids=["in memory", "in a file"])
def in_file(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether every state is kept in a file (read by pieces of 8), as a large model's is."""
    if request.param:
        monkeypatch.setattr(state_files, "IN_FILE_FROM", 0)
        monkeypatch.setattr(state_files, "PIECE", 8)
    return bool(request.param)


@pytest.mark.usefixtures("in_file")
def test_a_round_logs_its_sum_and_a_restart_steps_the_logged_sums_again_bit_for_bit(
    federation: Federation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chain_record, "WHOLE_EVERY", 3)  # rounds 1, 4 and 7's states written whole
    chain, state, files = federation.chain(tmp_path), federation.start, dict[str, tuple[int, int]]()
    chain.sent(1, *sent(state))
    for round_number in range(1, 9):
        words = federation.summed(round_number)
        chain.verified(round_number, words, NAMES, federation.encoder(round_number))
        moved = federation.stepped(state, words, round_number)  # the aggregator's step: the whole state at once
        before, files = files, kept_files_of(chain)
        # Round r's state is the last state written whole stepped by (r - 1) % 3 logged sums, and its step one
        # more, or (the third) written whole: a sum a round, its d + 1 words, a state one round in 3.
        since = (round_number - 1) % 3
        sums = [size for name, (_, size) in files.items() if name.endswith(chain_record.SUM_SUFFIX)]
        assert sums == [words.nbytes] * min(since + 1, 2), (round_number, sorted(files))
        assert len(files) - len(sums) == 1 + (since == 2), (round_number, sorted(files))
        assert all(files[name] == before[name] for name in set(files) & set(before))  # each written once, kept
        restarted = federation.chain(tmp_path).anchor  # a new process: the states made again of the logged sums
        assert restarted is not None and restarted.next is not None and restarted.round == round_number
        assert same_bits(restarted.state, state) and same_bits(restarted.next, moved), round_number
        state = moved
        chain.sent(round_number + 1, *sent(state))
    restarted_chain = federation.chain(tmp_path)  # takes the chain up and writes on from it
    restarted_chain.sent(9, *sent(state))
    restarted_chain.verified(9, federation.summed(9), NAMES, federation.encoder(9))
    now = kept_files_of(restarted_chain)  # round 7's state, its 2 sums since, round 10's state: whole
    assert len(now) == 4 and len(set(now) & set(files)) == 3 and chain.path is not None
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([chain.path.name, *now])  # the rest removed


@pytest.mark.usefixtures("in_file")
def test_the_state_before_the_anchors_is_let_go_before_the_step_writes_the_next(
    federation: Federation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its memory (a file of d values a tensor, in a file) is freed before the step writes as much: at d = 10^7 the
    # step's writes took fresh pages at twice the CPU when the record let it go only as it wrote (issue 97).
    site = federation.chain(tmp_path)
    site.sent(1, *sent(federation.start))
    assert site.anchor is not None
    first = weakref.ref(site.anchor.state)
    words = federation.summed(1)
    site.verified(1, words, NAMES, federation.encoder(1))
    site.sent(2, *sent(federation.stepped(federation.start, words, 1)))
    alive_as_stepped: list[bool] = []
    real = model_chain.stepped

    def watched(*arguments: Any, **keywords: Any) -> HeldState:
        alive_as_stepped.append(first() is not None)
        return real(*arguments, **keywords)

    monkeypatch.setattr(model_chain, "stepped", watched)
    site.verified(2, federation.summed(2), NAMES, federation.encoder(2))
    assert alive_as_stepped == [False]
    assert site.anchor is not None and site.anchor.next is not None  # the step was taken, and kept
    assert restarted_anchor(federation, tmp_path).round == 2


def test_a_bounded_rounds_total_is_logged_and_stepped_again_bit_for_bit(federation: Federation, tmp_path: Path) -> None:
    chain = federation.chain(tmp_path)
    chain.sent(1, *sent(federation.start))
    bits, length = 30, update_dimension(federation.start.theta.numel(), corrects_drift=False)
    total = np.random.default_rng(1).integers(-(2**20), 2**20, length)  # 2^30 times a sum within every bound
    chain.verified_fixed_point(1, total, NAMES, bits)
    assert chain.anchor is not None and chain.anchor.next is not None
    sums = [size for name, (_, size) in kept_files_of(chain).items() if name.endswith(chain_record.SUM_SUFFIX)]
    assert sums == [total.nbytes]
    restarted = restarted_anchor(federation, tmp_path)
    assert restarted.next is not None
    made = chain.anchor.next
    assert all(
        restarted.next.values(field, 0, made.dimension).tobytes() == made.values(field, 0, made.dimension).tobytes()
        for field in made.fields
    )


def test_a_state_in_a_file_is_copied_by_pieces_where_the_system_cannot_copy_it(
    federation: Federation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_files, "IN_FILE_FROM", 0)
    monkeypatch.setattr(state_files, "PIECE", 8)

    def cannot(*_: object) -> int:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))  # another file system, as the kernel may refuse

    monkeypatch.setattr(os, "copy_file_range", cannot)
    chain = federation.chain(tmp_path)
    two_rounds(federation, chain)
    chain.verified(2, federation.summed(2), NAMES, federation.encoder(2))
    assert chain.path is not None and chain.anchor is not None and chain.anchor.next is not None
    after = restarted_anchor(federation, tmp_path).next
    assert after is not None and after.in_file and chain.anchor.next.in_file
    for field in after.fields:
        length = after.dimension + (field in ("control", "velocity"))
        assert np.array_equal(after.values(field, 0, length), chain.anchor.next.values(field, 0, length)), field


def test_a_crash_before_the_anchor_is_replaced_leaves_the_old_one_whole(
    federation: Federation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain = federation.chain(tmp_path)
    state = two_rounds(federation, chain)
    before = kept_files_of(chain)

    def crash(*_: object) -> None:
        raise OSError(errno.EIO, "the disk went away")

    with monkeypatch.context() as patched:
        patched.setattr(chain_record, "atomic_write", crash)  # the new state file synced, the anchor not replaced
        with pytest.raises(OSError):
            chain.verified(2, federation.summed(2), NAMES, federation.encoder(2))
    assert kept_files_of(chain) == before  # the new sum's file removed, the old anchor's untouched
    assert chain.path is not None
    stem = chain.path.name.removesuffix(".npz")
    strays = [chain.path.parent / f"{stem}.left-by-a-crash{suffix}" for suffix in (".state", ".sum")]
    for stray in strays:
        stray.write_bytes(b"half a file")  # a crash that left its file behind
    restarted = federation.chain(tmp_path)
    restarted.sent(2, *sent(state))  # the old anchor: round 1's step is round 2's model
    assert restarted.anchor is not None and restarted.anchor.round == 2
    restarted.verified(2, federation.summed(2), NAMES, federation.encoder(2))
    assert not any(stray.exists() for stray in strays) and len(kept_files_of(restarted)) == 3  # round 1's, 2 sums


def test_an_average_that_is_theta_is_written_once_and_read_back_as_theta(
    federation: Federation, tmp_path: Path, in_file: bool
) -> None:
    chain = federation.chain(tmp_path)
    two_rounds(federation, chain)
    chain.verified(2, federation.summed(2), NAMES, federation.encoder(2))
    assert chain.anchor is not None and chain.anchor.next is not None and chain.path is not None
    written = chain.anchor
    assert (
        written.next is not None and written.state.averaged_rounds == 0 == written.next.averaged_rounds
    )  # the plan averages from a later round
    # One copy of theta in the state written whole (round 1's, both states' start) where there were two.
    with np.load(chain.path) as members:
        document = json.loads(str(members["anchor"]))
    assert "theta_average" in document["state.fields"] and "theta_average" not in document["state.stored"]
    size = sum(8 * (written.state.dimension + (field in ("control", "velocity"))) for field in document["state.stored"])
    states = [size for name, (_, size) in kept_files_of(chain).items() if name.endswith(chain_record.STATE_SUFFIX)]
    assert states == [size]
    anchor = restarted_anchor(federation, tmp_path)
    assert anchor.next is not None
    for kept, wanted in ((anchor.state, written.state), (anchor.next, written.next)):
        for field in ("theta", "theta_average"):
            assert all(np.array_equal(kept.values(field, a, b), wanted.values(field, a, b)) for a, b in kept.spans()), (
                field
            )
        if not in_file:  # two tensors of their own: stepping one in place leaves the other
            assert kept.values("theta", 0, 1).ctypes.data != kept.values("theta_average", 0, 1).ctypes.data


@pytest.mark.parametrize("version", [1, 2])
def test_an_anchor_of_an_earlier_version_holding_its_states_still_reads(
    federation: Federation, tmp_path: Path, version: int
) -> None:
    chain = federation.chain()
    two_rounds(federation, chain)
    chain.verified(2, federation.summed(2), NAMES, federation.encoder(2))
    written = chain.anchor
    assert written is not None and written.next is not None
    arrays: dict[str, np.ndarray] = {
        "format": np.array(chain_record.FORMAT),
        "version": np.array(version),
        "round": np.array(written.round),
        "verified": np.array(written.verified),
        "void": np.array(written.void),
    }
    for prefix, state in (("state", written.state), ("next", written.next)):
        arrays[f"{prefix}.fields"] = np.array(list(state.fields))
        for name in ("round", "c", "c_average", "averaged_rounds"):
            arrays[f"{prefix}.{name}"] = np.array(getattr(state, name))
        assert state.averaged_rounds == 0  # 2 wrote an average that is theta's copy once, as theta
        for field in (field for field in state.fields if version == 1 or field != "theta_average"):
            arrays[f"{prefix}.{field}"] = state.values(field, 0, state.dimension + (field in ("control", "velocity")))
    path = federation.chain(tmp_path).path
    assert path is not None
    np.savez(path, **arrays)  # type: ignore[arg-type]
    anchor = restarted_anchor(federation, tmp_path)
    assert anchor.next is not None and (anchor.round, anchor.verified) == (2, True)
    for field in ("theta", "theta_average"):
        assert np.array_equal(anchor.next.values(field, 0, 8), written.next.values(field, 0, 8))


def test_an_anchor_of_version_3_each_state_in_a_file_still_reads(
    federation: Federation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chain_record, "WHOLE_EVERY", 1)  # every state written whole: version 3's files
    chain = federation.chain(tmp_path)
    state = two_rounds(federation, chain)
    words = federation.summed(2)
    chain.verified(2, words, NAMES, federation.encoder(2))
    assert chain.path is not None
    with np.load(chain.path) as members:
        document = json.loads(str(members["anchor"]))
    assert document.pop("sums") == {} and document.pop("state.sums") == [] == document.pop("next.sums")
    del document["state.made"], document["next.made"]  # what version 4 added
    old = {"format": np.array(chain_record.FORMAT), "version": np.array(3), "anchor": np.array(json.dumps(document))}
    np.savez(chain.path, **old)  # type: ignore[arg-type]
    anchor = restarted_anchor(federation, tmp_path)
    assert anchor.next is not None and same_bits(anchor.state, state)
    assert same_bits(anchor.next, federation.stepped(state, words, 2))


@pytest.mark.parametrize("cut", ["the anchor", "a logged sum"])
def test_an_unreadable_anchor_is_set_aside_and_nothing_past_round_1_is_taken(
    federation: Federation, tmp_path: Path, caplog: pytest.LogCaptureFixture, cut: str
) -> None:
    chain = federation.chain(tmp_path)
    state = two_rounds(federation, chain)
    chain.verified(2, federation.summed(2), NAMES, federation.encoder(2))
    assert chain.path is not None
    if cut == "the anchor":
        chain.path.write_bytes(chain.path.read_bytes()[:100])
    else:
        (logged, *_) = sorted(name for name in kept_files_of(chain) if name.endswith(chain_record.SUM_SUFFIX))
        (tmp_path / logged).write_bytes((tmp_path / logged).read_bytes()[:-2])  # a word short
    restarted = federation.chain(tmp_path)
    with pytest.raises(UncheckedModelError):
        restarted.sent(3, *sent(federation.stepped(state, federation.summed(2), 2)))
    assert "is unreadable" in caplog.text and (cut == "the anchor" or "holds" in caplog.text)


def test_the_outcome_record_keeps_the_rounds_sat_out(tmp_path: Path) -> None:
    record = OutcomeRecord(tmp_path / "site-a.f.outcome.npz", 0)
    record.unchecked(3, "it did not verify round 2's sum")
    record.unchecked(4, "it did not verify round 2's sum")
    record.unchecked(3, "a later reason does not replace the first")
    again = OutcomeRecord(tmp_path / "site-a.f.outcome.npz", 0)
    assert again.sat_out == {3: "it did not verify round 2's sum", 4: "it did not verify round 2's sum"}
    assert again.unchecked_output() == (3, "it did not verify round 2's sum")
    again.output_model(5, np.zeros(3, dtype=np.float32), 0.5)  # an output model the chain checked since
    assert OutcomeRecord(tmp_path / "site-a.f.outcome.npz", 0).unchecked_output() is None
