"""The collaborator's check of the final model bundle, and the outcome record its closing count comes from.

The bundles here are written by the aggregator's own code (`federation_bundle`), so the honest case is the
bundle a real aggregator sends; each forgery changes one thing of it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfair.bundle import Bundle, write_bundle
from fedfair.runtime.aggregator.bundles import federation_bundle
from fedfair.runtime.aggregator.checkpoint import Checkpoint
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.core import server
from fedfair.runtime.collaborator import receipt, trajectory
from fedfair.runtime.collaborator.outcome import Excluded, OutcomeRecord
from fedfair.runtime.collaborator.trajectory import ServedModel, Stored, Trajectory, whole
from fedfair.runtime.collaborator.receipt import (
    Expectation,
    Received,
    bundle_mismatch,
    finished_status,
    receive_bundle,
)
from fedfair.runtime.failures import EXIT_INCOMPLETE
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import (
    AggregatorPlan,
    load_aggregator_plan,
    load_shared_settings,
    plan_digest,
    shared_settings,
)

ROUNDS = 3
NAMES = ["site-a", "site-b"]
RECORDS = [{"round": r, "status": "applied", "contributors": NAMES, "c": 2.0} for r in range(1, ROUNDS + 1)]


@dataclasses.dataclass
class Federation:
    """A plan, the output model its aggregator reached, and what a collaborator of it expects."""

    plan: AggregatorPlan
    checkpoint: Checkpoint
    expected: Expectation
    output: ServedModel[np.ndarray]

    def bundle(self, plan: AggregatorPlan | None = None) -> Bundle:
        """The aggregator's bundle of the output model, under `plan` (default: this federation's)."""
        return federation_bundle(plan or self.plan, self.checkpoint, RECORDS)


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    """One federation for the module's tests (its workspace's certificates take a second to make); none changes it."""
    workspace = make_workspace(tmp_path_factory.mktemp("federation"), NAMES, plan={"model": {"name": "mlp"}})
    plan = load_aggregator_plan(workspace.plan)
    start = initial_state(plan)
    # theta-bar unlike theta_0 and the last iterate, in float64 with digits a float32 cast rounds away.
    generator = torch.Generator().manual_seed(7)
    theta_bar = start.theta + torch.randn(start.theta.shape, generator=generator, dtype=torch.float64) / 3
    state = dataclasses.replace(start, theta=start.theta + 1.0, theta_average=theta_bar, c_average=2.123456789)
    checkpoint = Checkpoint(ROUNDS, state, plan_digest(plan))
    served = shared_settings(plan)
    shared = load_shared_settings(served)
    expected = Expectation(plan.federation_id, json.loads(served), shared.model, shared.training.seed, (), None)
    return Federation(plan, checkpoint, expected, ServedModel(ROUNDS, theta_bar.numpy(), state.c_average))


def test_the_honest_bundle_matches_bit_for_bit(federation: Federation) -> None:
    """The aggregator casts theta-bar (float64) into the model's float32 parameters; the collaborator's same cast
    gives the same tensors, so the comparison is exact, not within a tolerance."""
    bundle = federation.bundle()
    assert all(tensor.dtype == torch.float32 for tensor in bundle.state_dict.values())
    assert bundle_mismatch(bundle, federation.expected, federation.output) is None


def test_a_built_in_model_is_checked_without_a_second_copy_of_its_parameters(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its tensors' layout from a build on the meta device, its values the output model's: no model is loaded."""

    def no_load(*_: object) -> None:
        raise AssertionError("a built-in model without buffers is not built and loaded to check its bundle")

    monkeypatch.setattr(receipt, "load_flat_parameters", no_load)
    bundle = federation.bundle()
    assert bundle_mismatch(bundle, federation.expected, federation.output) is None
    first = next(iter(bundle.state_dict))
    forged = dataclasses.replace(bundle, state_dict={**bundle.state_dict, first: bundle.state_dict[first] + 1.0})
    assert (bundle_mismatch(forged, federation.expected, federation.output) or "").startswith("model: ")
    short = dataclasses.replace(federation.output, theta=federation.output.theta[:-1])
    assert "does not fit the plan's model" in (bundle_mismatch(bundle, federation.expected, short) or "")


def test_an_output_model_kept_in_the_record_is_checked_a_slice_at_a_time(
    federation: Federation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read from the outcome record 7 values at a time (slices across the model's tensors), never whole: the output
    model whole beside the bundle, in every site at once, was a federation's peak."""

    def not_whole(*_: object) -> None:
        raise AssertionError("a built-in model's output model is not read whole to check its bundle")

    monkeypatch.setattr(trajectory, "_SLICE", 7)
    monkeypatch.setattr(receipt, "whole", not_whole)
    record = OutcomeRecord(tmp_path / "site-a.fed.outcome.npz", 0)
    record.output_model(ROUNDS, federation.output.theta, federation.output.c)
    output = record.output
    assert output is not None and isinstance(output.theta, Stored)
    bundle = federation.bundle()
    assert bundle_mismatch(bundle, federation.expected, output) is None
    for name in bundle.state_dict:  # the first and the last value of each tensor: each piece's edges
        for where in (0, -1):
            tampered = bundle.state_dict[name].clone()
            tampered.view(-1)[where] += 1.0
            forged = dataclasses.replace(bundle, state_dict={**bundle.state_dict, name: tampered})
            reason = bundle_mismatch(forged, federation.expected, output) or ""
            assert reason.startswith("model: 1 of ") and f"(in {name})" in reason, (name, where, reason)


def test_a_bundle_of_another_federation_is_refused_even_with_the_same_model(federation: Federation) -> None:
    bundle = federation.bundle(dataclasses.replace(federation.plan, federation_id="fed"))
    reason = bundle_mismatch(bundle, federation.expected, federation.output)
    assert reason is not None and reason.startswith("federation: ")
    assert "'fed'" in reason and repr(federation.plan.federation_id) in reason


def test_a_bundle_under_another_plan_is_refused_naming_the_field(tmp_path: Path, federation: Federation) -> None:
    workspace = make_workspace(tmp_path / "other", NAMES, plan={"model": {"name": "mlp"}})
    rounds = federation.plan.training.rounds
    other = load_aggregator_plan(workspace.plan, {"training": {"rounds": rounds + 1}})
    assert other.federation_id == federation.plan.federation_id
    reason = bundle_mismatch(federation.bundle(other), federation.expected, federation.output)
    assert reason is not None and reason.startswith("plan: ")
    assert f"joined -> bundle: training.rounds: {rounds} -> {rounds + 1}" in reason, reason


@pytest.mark.parametrize("where", [0, -1])
def test_one_weight_one_ulp_away_is_refused(federation: Federation, where: int) -> None:
    """The smallest change a float32 weight can take (one ulp) is named, with how many weights differ."""
    bundle = federation.bundle()
    name = next(iter(bundle.state_dict)) if where == 0 else list(bundle.state_dict)[-1]
    tampered = bundle.state_dict[name].clone()
    flat = tampered.view(-1)
    flat[where] = torch.nextafter(flat[where], torch.tensor(np.inf, dtype=flat.dtype))
    step = abs(float(flat[where]) - float(bundle.state_dict[name].view(-1)[where]))
    forged = dataclasses.replace(bundle, state_dict={**bundle.state_dict, name: tampered})
    reason = bundle_mismatch(forged, federation.expected, federation.output)
    total = sum(tensor.numel() for tensor in bundle.state_dict.values())
    assert reason == (
        f"model: 1 of {total} weights differ from the output model (theta-bar) this collaborator was sent to "
        f"evaluate in round {ROUNDS}, the largest by {step:.3g} (in {name})"
    )


def test_another_threshold_is_refused(federation: Federation) -> None:
    forged = dataclasses.replace(federation.bundle(), threshold=np.nextafter(federation.output.c, 0.0))
    reason = bundle_mismatch(forged, federation.expected, federation.output)
    assert reason is not None and reason.startswith("model: the bundle's threshold c = ")


def test_another_architecture_or_encoder_is_refused(federation: Federation) -> None:
    bundle = federation.bundle()
    wider = {**bundle.architecture, "features": bundle.architecture["features"] + 1}
    reason = bundle_mismatch(dataclasses.replace(bundle, architecture=wider), federation.expected, federation.output)
    assert reason is not None and reason.startswith("architecture: ")
    encoded = dataclasses.replace(federation.expected, encoder={"columns": []})
    reason = bundle_mismatch(bundle, encoded, federation.output)
    assert reason is not None and reason.startswith("encoder: ")


def write(bundle: Bundle, path: Path) -> bytes:
    write_bundle(path, bundle)
    return path.read_bytes()


def pieces(payload: bytes) -> Callable[[Callable[[bytes], object]], None]:
    """A fetch that hands `payload` on in pieces of 1000 bytes, as chunks arrive."""

    def fetch(sink: Callable[[bytes], object]) -> None:
        for start in range(0, len(payload), 1000):
            sink(payload[start : start + 1000])

    return fetch


def test_receive_keeps_only_a_bundle_that_checks_out(tmp_path: Path, federation: Federation) -> None:
    path = tmp_path / "site-a.fed.model_bundle.pt"
    forged = write(federation.bundle(dataclasses.replace(federation.plan, federation_id="fed")), tmp_path / "forged")
    refused = receive_bundle("site-a", path, pieces(forged), federation.expected, federation.output)
    assert refused.kept is None and refused.refusal is not None and refused.refusal.startswith("federation: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forged"]  # nothing kept, nothing left over
    honest = write(federation.bundle(), tmp_path / "honest")
    assert receive_bundle("site-a", path, pieces(honest), federation.expected, federation.output) == Received(path)
    assert path.read_bytes() == honest


def test_a_bundle_that_cannot_be_checked_is_not_kept(
    tmp_path: Path, federation: Federation, caplog: pytest.LogCaptureFixture
) -> None:
    """No output model was sent here (the site missed the final evaluation): not a refusal, but nothing kept."""
    path = tmp_path / "site-a.fed.model_bundle.pt"
    honest = write(federation.bundle(), tmp_path / "honest")
    with caplog.at_level(logging.WARNING, "fedfair.collaborator"):
        assert receive_bundle("site-a", path, pieces(honest), federation.expected, None) == Received()
    assert not path.exists()
    assert "cannot check that the bundle holds it" in caplog.text


def test_the_closing_line_counts_the_own_record_and_says_where_the_bundle_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kept = tmp_path / "site-a.fed.model_bundle.pt"
    with caplog.at_level(logging.INFO, "fedfair.collaborator"):
        assert finished_status("site-a", ROUNDS, 0, Received()) == EXIT_INCOMPLETE
        assert finished_status("site-a", ROUNDS, ROUNDS, Received(kept)) == 0
    incomplete, complete = (record.getMessage() for record in caplog.records)
    assert f"its model holds this institution's update in 0 of {ROUNDS} rounds" in incomplete
    assert incomplete.endswith("; no model bundle is kept (the warning above says why)"), incomplete
    assert f"its model holds this institution's update in {ROUNDS} of {ROUNDS} rounds" in complete
    assert f"; the model bundle is in {kept}, checked against" in complete
    assert complete.endswith(f"(use it: fedfair predict --model {kept} --data TABLE --out PREDICTIONS.csv)")


def test_the_outcome_record_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "site-a.fed.outcome.npz"
    record = OutcomeRecord(path, 1)
    for round_number in (1, 2, 2, 3):  # round 2 re-run after an aggregator crash: one round contributed to
        record.held(round_number)
    record.aborted(3)
    record.aborted(4)  # announced for a round it sent nothing to: no change
    theta = np.linspace(-1.0, 1.0, 5)
    record.output_model(3, theta, 0.25)
    again = OutcomeRecord(path, 1)
    assert again.contributed == 2
    assert again.output is not None and again.output.round == 3 and again.output.c == 0.25
    assert np.array_equal(whole(again.output.theta), theta)
    again.held(3)  # round 3 run again (the aggregator resumed) and sent: it counts again
    assert OutcomeRecord(path, 1).contributed == 3


def test_the_outcome_record_keeps_each_liar_a_verdict_record_named_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "site-a.fed.outcome.npz"
    record = OutcomeRecord(path, 1)
    record.held(1)
    assert OutcomeRecord(path, 1).liars == ()  # a record written before any liar (or by an older release) loads
    first = Excluded(1, "site-b", "the norm equation fails", "ab" * 32, "site-a.fed.round-1.verdict_record")
    record.excluded(first)
    record.excluded(first)  # the same round's record checked again (a re-run round): named once
    second = Excluded(2, "site-c", "a slack bit is not a bit; the norm equation fails", "cd" * 32, "")
    record.excluded(second)
    again = OutcomeRecord(path, 1)
    assert again.liars == (first, second)
    assert again.contributed == 1


def test_an_outcome_record_unreadable_past_its_refusal_keeps_no_part_of_it(tmp_path: Path) -> None:
    # Read in order, a refusal can be loaded before a later field fails: starting again must drop it too.
    path = tmp_path / "site-a.fed.outcome.npz"
    empty = np.array([], dtype=np.int64)
    with path.open("wb") as stream:
        np.savez(
            stream,
            contributed=empty,
            aborted=empty,
            refused_round=np.array(2, dtype=np.int64),
            refused_reason=np.array("FORGED"),
            refused_detail=np.array("a moved sum"),
        )
    record = OutcomeRecord(path, 1)
    assert record.refusal is None and record.output_mismatch() is None and record.contributed == 0


def test_an_unreadable_outcome_record_starts_again_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "site-a.fed.outcome.npz"
    path.write_bytes(b"not an npz")
    with caplog.at_level(logging.WARNING, "fedfair.collaborator"):
        record = OutcomeRecord(path, 1)
    assert record.contributed == 0 and record.output is None
    assert f"{path} is unreadable" in caplog.text


# ---------------------------------------------------------------- the output model from the training rounds


def run_server(
    rounds: int, aborted: set[int], average_from: int, seed: int = 3
) -> tuple[list[ServedModel[np.ndarray]], ServedModel[np.ndarray]]:
    """`rounds` rounds of the server's own step (`server.apply`) on random aggregates, the rounds in `aborted`
    leaving the model as it was: each round's start model as sent for training, and the output model."""
    generator = torch.Generator().manual_seed(seed)
    state = server.init(torch.randn(50, generator=generator, dtype=torch.float64), bound=3.0)
    sent = []
    for round_number in range(1, rounds + 1):
        sent.append(ServedModel(round_number, state.theta.numpy().copy(), state.c))
        if round_number not in aborted:
            aggregate = server.Aggregate(torch.randn(50, generator=generator, dtype=torch.float64) / 7, -0.3, 2.0)
            state = server.apply(state, aggregate, bound=3.0, average_from=average_from)
    return sent, ServedModel(rounds, state.theta_average.numpy().copy(), state.c_average)


def followed(sent: list[ServedModel[np.ndarray]], average_from: int) -> Trajectory:
    trajectory = Trajectory(average_from)
    for model in sent:
        trajectory.sent(model)
    return trajectory


@pytest.mark.parametrize(
    ("rounds", "aborted", "average_from"),
    [(8, set(), 4), (8, set(), 0), (8, {3, 6}, 4), (8, {8}, 4), (8, {2, 8}, 0), (6, {1, 2, 3, 4}, 3), (1, set(), 0)],
)
def test_the_output_model_is_the_average_of_the_training_rounds_models(
    rounds: int, aborted: set[int], average_from: int
) -> None:
    """Whatever rounds abort (the last too), the site's average of the models it was sent is the server's output
    (within the rounding bound; here bit for bit); 1e-9 added to one coordinate is told apart."""
    sent, output = run_server(rounds, aborted, average_from)
    trajectory = followed(sent, average_from)
    assert trajectory.mismatch(output) is None
    shifted = output.theta.copy()
    shifted[7] += 1e-9
    reason = trajectory.mismatch(ServedModel(rounds, shifted, output.c))
    applied = rounds - len(aborted)
    if applied <= average_from and rounds not in aborted:
        assert reason is None  # the output may be the model after the last step, which no site is sent
    else:
        assert reason is not None and reason.startswith("model: the output model this collaborator was sent")


@pytest.mark.parametrize("output_type", [np.float64, np.float32])
@pytest.mark.parametrize(
    ("rounds", "aborted", "average_from"), [(8, set(), 4), (8, {3, 6}, 4), (8, {8}, 4), (8, {2, 8}, 0)]
)
def test_models_sent_in_float32_still_average_to_the_output(
    rounds: int, aborted: set[int], average_from: int, output_type: type[np.floating]
) -> None:
    """Models travel in float32 (`contract.model_download`) while the server averages its float64 ones: the
    site's average and the output model are each within half a float32 ulp of the scale, which the bound
    allows, and a shift of four float32 ulps of the scale is still told apart."""
    sent, output = run_server(rounds, aborted, average_from)
    narrowed = [ServedModel(model.round, model.theta.astype(np.float32), model.c) for model in sent]
    trajectory = followed(narrowed, average_from)
    cast = ServedModel(output.round, output.theta.astype(output_type), output.c)
    assert trajectory.mismatch(cast) is None
    scale = max(float(np.abs(model.theta).max()) for model in sent)
    shifted = cast.theta.copy()
    shifted[7] += 4 * float(np.finfo(np.float32).eps) * scale
    reason = trajectory.mismatch(ServedModel(rounds, shifted, output.c))
    assert reason is not None and "rounding allows" in reason


def test_a_model_the_aggregator_chose_is_not_the_average() -> None:
    """The output model of another run (another seed) on the same rounds is refused, with its distance."""
    sent, _ = run_server(8, {3}, 4)
    _, other = run_server(8, {3}, 4, seed=4)
    reason = followed(sent, 4).mismatch(other)
    assert reason is not None and "average of the" in reason and "rounding allows" in reason


@pytest.mark.parametrize(("rounds", "aborted", "average_from"), [(8, {3, 6}, 4), (8, {8}, 4), (9, {2}, 0)])
def test_the_average_and_the_check_by_slices_are_the_whole_vectors_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, rounds: int, aborted: set[int], average_from: int
) -> None:
    """Folded and compared 7 coordinates at a time (the 50 split unevenly), the average is the whole-vector
    a + (x - a) / k of every model the site was sent, and the check reports the very gap and bound."""
    sent, output = run_server(rounds, aborted, average_from)
    _, other = run_server(rounds, aborted, average_from, seed=4)
    whole = followed(sent, average_from)
    monkeypatch.setattr("fedfair.runtime.collaborator.trajectory._SLICE", 7)
    sliced = followed(sent, average_from)
    expected, count = None, 0
    for previous, model in zip(sent, sent[1:], strict=False):
        if not np.array_equal(previous.theta, model.theta):
            count += 1
            if count > average_from:
                folds = count - average_from
                expected = previous.theta.copy() if expected is None else expected + (previous.theta - expected) / folds
    assert whole.average is not None and sliced.average is not None and expected is not None
    assert np.array_equal(trajectory.whole(sliced.average), expected)
    assert np.array_equal(trajectory.whole(whole.average), expected)
    assert sliced.mismatch(output) is None
    assert sliced.mismatch(other) == whole.mismatch(other) is not None


def test_a_site_that_missed_a_round_cannot_tell() -> None:
    sent, _ = run_server(6, set(), 3)
    _, other = run_server(6, set(), 3, seed=4)
    trajectory = followed([model for model in sent if model.round != 4], 3)
    assert not trajectory.following and trajectory.mismatch(other) is None


@pytest.mark.parametrize("slice_size", [7, 1 << 20])
def test_a_rerun_round_and_a_restart_keep_the_average(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, slice_size: int
) -> None:
    """Round 3 sent twice (an aggregator resumed), the record reloaded between rounds: the output still checks,
    the models read back from the record's file 7 coordinates at a time (the 50 split unevenly) or whole."""
    monkeypatch.setattr("fedfair.runtime.collaborator.trajectory._SLICE", slice_size)
    sent, output = run_server(6, {2}, 3)
    path = tmp_path / "site-a.fed.outcome.npz"
    for model in [*sent[:3], sent[2], *sent[3:]]:
        OutcomeRecord(path, 3).training_model(model.round, model.theta, model.c)
    record = OutcomeRecord(path, 3)
    record.output_model(output.round, output.theta, output.c)
    assert OutcomeRecord(path, 3).output_mismatch() is None
    record.output_model(output.round, output.theta + 1e-6, output.c)
    assert OutcomeRecord(path, 3).output_mismatch() is not None


def test_a_round_that_left_the_model_as_it_was_is_not_counted(tmp_path: Path) -> None:
    """Round 2's sum held this site's update, but the aggregator's checks of the decoded sum voided it without an
    announcement: round 3 is sent round 2's model, so round 2 does not count (it is kept across a restart)."""
    path = tmp_path / "site-a.fed.outcome.npz"
    record = OutcomeRecord(path, 1)
    models = {1: np.zeros(4), 2: np.ones(4), 3: np.ones(4)}
    for round_number, theta in models.items():
        record.training_model(round_number, theta, 1.0)
        record.held(round_number)
    assert record.contributed == 2
    assert OutcomeRecord(path, 1).contributed == 2


def test_the_record_keeps_the_served_models_in_its_file_not_the_callers_arrays(tmp_path: Path) -> None:
    """No model is held in memory per model followed: the record's file keeps what was sent, so the caller's
    arrays, reused afterwards, change nothing."""
    record = OutcomeRecord(tmp_path / "site-a.fed.outcome.npz", 0)
    theta = np.linspace(-1.0, 1.0, 9)
    record.training_model(1, theta, 0.5)
    record.output_model(1, theta, 0.5)
    sent = theta.copy()
    theta[:] = 7.0
    assert record.output is not None and isinstance(record.output.theta, Stored)  # read a slice at a time
    assert np.array_equal(whole(record.output.theta), sent)
    assert record.output_mismatch() is None


def test_a_save_that_changes_no_model_copies_the_models_as_they_stand(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Round 2's sum held this update: the record is saved again with the same models, which are copied from the
    file it replaces, not read back as values (issue 97: 12 MB read, checksummed and written a save at d = 10^6);
    reloaded, the record holds them bit for bit and still checks the output model."""
    path = tmp_path / "site-a.fed.outcome.npz"
    sent, output = run_server(3, set(), 0)
    record = OutcomeRecord(path, 0)
    for model in sent[:2]:
        record.training_model(model.round, model.theta, model.c)
    with monkeypatch.context() as patch:
        patch.setattr(Stored, "slices", lambda _: pytest.fail("a model kept unchanged was read back"))
        record.held(2)
    again = OutcomeRecord(path, 0)
    assert again.contributed == 1  # round 2, held
    for model in sent[2:]:
        again.training_model(model.round, model.theta, model.c)
    again.output_model(output.round, output.theta, output.c)
    assert OutcomeRecord(path, 0).output_mismatch() is None
