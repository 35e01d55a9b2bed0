"""A model chain whose states live in files, stepped a piece at a time, is the in-memory chain bit for bit (issue 66)."""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedfair.core import server
from fedfair.core.algorithm import FedSRCVaR
from fedfair.core.errors import VerificationError, VerifyReason
from fedfair.runtime import state_files
from fedfair.runtime.collaborator.chain import ModelChain
from fedfair.runtime.state_files import HeldState
from fedfair.core.update import update_dimension
from fedfair.runtime.contract import model_digest, model_download, training_download
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import (
    SharedSettings,
    load_aggregator_plan,
    load_shared_settings,
    shared_settings,
)
from fedfair.secagg import Encoder

NAMES = ("site-a", "site-b", "site-c")
ROUNDS = 4


@pytest.fixture(scope="module")
def plan_settings(tmp_path_factory: pytest.TempPathFactory) -> SharedSettings:
    """A secure plan of ROUNDS rounds, as a site holds it."""
    workspace = make_workspace(tmp_path_factory.mktemp("chain-states"), NAMES, plan={"training": {"rounds": ROUNDS}})
    return load_shared_settings(shared_settings(load_aggregator_plan(workspace.plan)))


@dataclasses.dataclass
class Step:
    """The server step both chains and the aggregator take: the plan's training settings and, or, FedAdam."""

    shared: SharedSettings
    adam: server.Adam | None

    def algorithm(self) -> FedSRCVaR:
        plain = self.shared.algorithm()
        return plain if self.adam is None else dataclasses.replace(plain, momentum=0.0, adam=self.adam)

    @property
    def corrects_drift(self) -> bool:
        return self.shared.training.local.corrects_drift

    def summed(self, round_number: int, parameters: int, seed: int) -> tuple[np.ndarray, Encoder]:
        """Round `round_number`'s encoded sum of three random updates of a model of `parameters`, and its encoder."""
        shared, length = self.shared, update_dimension(parameters, corrects_drift=self.corrects_drift)
        encoding = shared.training_encoding(shared.federation_id, len(NAMES), round_number, length)
        encoder = Encoder(encoding, len(NAMES))
        weights = [shared.influence.weight_of(name, shared.batch_fraction) for name in NAMES]  # each site's agreed one
        generator = np.random.default_rng(seed)
        inputs = [encoder.encode(generator.uniform(-0.01, 0.01, length), weight) for weight in weights]
        return np.sum(inputs, axis=0, dtype=encoder.dtype), encoder  # modulo 2^k, as the masks cancel

    def stepped(self, state: server.ServerState, words: np.ndarray, encoder: Encoder) -> server.ServerState:
        """The state the aggregator makes of the sum `words`: decoded whole, the step applied to the whole state."""
        shared = self.shared
        total = shared.influence.total_weight(NAMES, shared.batch_fraction)
        decoded = torch.from_numpy(encoder.decode(words, len(NAMES)).weighted_sum)
        aggregate = server.Aggregate.from_vector(decoded, total, with_control=self.corrects_drift)
        return self.algorithm().server_apply(state, aggregate, average_from=shared.training.average_from_round)

    def download(self, state: server.ServerState) -> tuple[np.ndarray, float, np.ndarray | None]:
        """(theta, c, control) of `state` as a TRAIN download carries it (a built-in model)."""
        control = None if state.control is None else state.control.numpy()
        values = training_download(state.theta.numpy(), control, builtin=True)
        theta = values[: state.theta.numel()]
        return theta, state.c, None if control is None else values[state.theta.numel() :]


def step_settings(shared: SharedSettings, drift: bool, momentum: float, average_from: float) -> SharedSettings:
    training = shared.training
    local = dataclasses.replace(training.local, drift_correction="scaffold" if drift else "none")
    changed = dataclasses.replace(training, local=local, server_momentum=momentum, average_from=average_from)
    return dataclasses.replace(shared, training=changed)


def whole(kept: HeldState | server.ServerState) -> dict[str, object]:
    """Every value of a state, its tensors as bytes: equal exactly when the states are equal bit for bit."""
    scalars = {name: getattr(kept, name) for name in ("round", "c", "c_average", "averaged_rounds")}
    if isinstance(kept, server.ServerState):
        fields = [
            field.name for field in dataclasses.fields(kept) if isinstance(getattr(kept, field.name), torch.Tensor)
        ]
        return scalars | {name: getattr(kept, name).numpy().tobytes() for name in fields}
    tensors = {}
    for name in kept.fields:
        length = kept.dimension + (1 if name in ("control", "velocity") else 0)
        tensors[name] = b"".join(kept.values(name, start, stop).tobytes() for start, stop in kept.spans(length))
    return scalars | tensors


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site's own folder, where its chain keeps states in files."""
    return tmp_path_factory.mktemp("site-a")


def start(step: Step, dimension: int, seed: int) -> server.ServerState:
    """The server's initial state of a built-in model (float32 values) of `dimension` parameters."""
    theta = torch.randn(dimension, generator=torch.Generator().manual_seed(seed)).to(torch.float64)
    return step.algorithm().server_init(theta)


def refusal(chain: ModelChain, round_number: int, model: tuple[np.ndarray, float, np.ndarray | None]) -> str:
    """The refusal `chain` gives the model sent for `round_number` (it must refuse it)."""
    with pytest.raises(VerificationError) as caught:
        chain.sent(round_number, *model)
    assert caught.value.reason is VerifyReason.NEXT_MODEL and caught.value.round == round_number
    return str(caught.value)


def forged(
    model: tuple[np.ndarray, float, np.ndarray | None], where: int
) -> tuple[np.ndarray, float, np.ndarray | None]:
    """`model` with theta's value `where` moved one unit in the last place."""
    theta = model[0].copy()
    theta[where] = np.nextafter(theta[where], theta.dtype.type(np.inf))
    return theta, model[1], model[2]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    piece=st.integers(2, 6),
    pieces=st.integers(1, 4),
    rest=st.integers(0, 4),
    drift=st.booleans(),
    mover=st.sampled_from(["plain", "momentum", "adam"]),
    average_from=st.sampled_from([0.0, 0.5]),
    actions=st.lists(st.sampled_from(["next", "void", "evaluate", "forge"]), min_size=1, max_size=ROUNDS - 1),
    seed=st.integers(0, 2**16),
)
def test_a_chain_stepped_by_piece_in_a_file_is_the_in_memory_chain_bit_for_bit(
    plan_settings: SharedSettings,
    folder: Path,
    piece: int,
    pieces: int,
    rest: int,
    drift: bool,
    mover: str,
    average_from: float,
    actions: list[str],
    seed: int,
) -> None:
    dimension = pieces * piece + 1 + rest % (piece - 1)  # never a multiple of the piece: the last one is short
    shared = step_settings(plan_settings, drift, 0.9 if mover == "momentum" else 0.0, average_from)
    step = Step(shared, server.Adam(lr=0.01) if mover == "adam" else None)
    algorithm = step.algorithm()
    state = start(step, dimension, seed)
    with (
        mock.patch.object(SharedSettings, "algorithm", lambda _: algorithm),
        mock.patch.object(state_files, "PIECE", piece),
    ):
        for anchor in folder.glob("*.chain.npz"):  # an earlier example's: each example is a federation afresh
            anchor.unlink()
        initial = state.theta.clone()
        in_memory = ModelChain("site-a", shared, folder, lambda: initial)
        in_memory.sent(1, *step.download(state))
        with mock.patch.object(state_files, "IN_FILE_FROM", 0):
            in_file = ModelChain("site-b", shared, folder, lambda: initial)
            in_file.sent(1, *step.download(state))
        chains = (in_memory, in_file)
        assert [chain.anchor.state.in_file for chain in chains if chain.anchor is not None] == [False, True]
        for number, action in enumerate(actions, start=1):
            words, encoder = step.summed(number, dimension, seed + number)
            moved = step.stepped(state, words, encoder)
            for chain in chains:
                chain.verified(number, words, NAMES, encoder)
                assert chain.anchor is not None and chain.anchor.next is not None
                assert whole(chain.anchor.next) == whole(moved)
            if action == "evaluate":
                for chain in chains:
                    chain.evaluated(number, model_download(moved.theta_average.numpy(), builtin=True), moved.c_average)
            if action == "forge":
                model = forged(step.download(moved), dimension - 1 - seed % dimension)
                refusals = {refusal(chain, number + 1, model) for chain in chains}
                assert len(refusals) == 1 and f"1 of {dimension} values differ" in refusals.pop()
                return
            if action != "void":
                state = moved
            for chain in chains:
                chain.sent(number + 1, *step.download(state))
        assert all(chain.anchor is not None and whole(chain.anchor.state) == whole(state) for chain in chains)
        assert all(chain.unchecked_from is None for chain in chains)
        # A missed round's signed model digest finds the state it ran on, by piece as whole (issue 98's catch-up).
        control = None if state.control is None else state.control.numpy()
        digest = model_digest(training_download(state.theta.numpy(), control, builtin=True), state.c)
        for chain in chains:
            assert chain.anchor is not None and chain.ran_on(chain.anchor.round, digest) is chain.anchor.state
            assert chain.ran_on(chain.anchor.round, digest[::-1]) is None


@pytest.fixture
def on_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chain keeps its states in files, read by pieces of 4 coordinates."""
    monkeypatch.setattr(state_files, "IN_FILE_FROM", 0)
    monkeypatch.setattr(state_files, "PIECE", 4)


def verified_chain(step: Step, folder: Path, dimension: int) -> tuple[ModelChain, server.ServerState]:
    """A site's chain once it verified round 1's sum and took round 2's model; that model's state."""
    state = start(step, dimension, 7)
    chain = ModelChain("site-a", step.shared, folder, lambda: state.theta)
    chain.sent(1, *step.download(state))
    words, encoder = step.summed(1, dimension, 1)
    chain.verified(1, words, NAMES, encoder)
    moved = step.stepped(state, words, encoder)
    chain.sent(2, *step.download(moved))
    return chain, moved


@pytest.mark.usefixtures("on_disk")
def test_on_disk_a_void_round_keeps_the_model_and_the_output_model_is_checked(
    plan_settings: SharedSettings, tmp_path: Path
) -> None:
    step = Step(plan_settings, None)
    chain, state = verified_chain(step, tmp_path, 11)
    assert chain.anchor is not None and chain.anchor.state.in_file
    words, encoder = step.summed(2, 11, 2)
    chain.verified(2, words, NAMES, encoder)
    moved = step.stepped(state, words, encoder)
    output = model_download(moved.theta_average.numpy(), builtin=True)
    chain.evaluated(2, output, moved.c_average)
    wrong = output.copy()
    wrong[9] = np.nextafter(wrong[9], np.float32(-np.inf))  # in the last, short piece
    with pytest.raises(VerificationError, match="NEXT_MODEL"):
        chain.evaluated(2, wrong, moved.c_average)
    chain.sent(3, *step.download(state))  # round 2 void after its check: the model before stays
    chain.sent(3, *step.download(state))  # round 3 run again: the same model
    assert chain.unchecked_from is None
    words, encoder = step.summed(3, 11, 3)
    chain.verified(3, words, NAMES, encoder)
    moved = step.stepped(state, words, encoder)
    chain.sent(4, *step.download(moved))
    assert chain.unchecked_from is None and chain.anchor is not None and whole(chain.anchor.state) == whole(moved)


@pytest.mark.usefixtures("on_disk")
@pytest.mark.parametrize("where", [0, 5, 10])
def test_on_disk_a_forged_next_model_is_refused_naming_the_round(
    plan_settings: SharedSettings, tmp_path: Path, where: int
) -> None:
    step = Step(plan_settings, None)
    chain, state = verified_chain(step, tmp_path, 11)
    words, encoder = step.summed(2, 11, 2)
    chain.verified(2, words, NAMES, encoder)
    moved = step.stepped(state, words, encoder)
    message = refusal(chain, 3, forged(step.download(moved), where))
    assert "1 of 11 values differ" in message


@pytest.mark.usefixtures("on_disk")
def test_on_disk_the_states_are_unnamed_files_in_the_sites_folder_closed_when_let_go(
    plan_settings: SharedSettings, tmp_path: Path
) -> None:
    def open_in_folder() -> Iterator[str]:
        for descriptor in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{descriptor}")
            except OSError:
                continue
            if target.startswith(str(tmp_path)):
                yield target

    chain, _ = verified_chain(Step(plan_settings, None), tmp_path, 11)
    # The named files are the anchor a restarted site takes up, round 1's state and round 1's sum (chain_record),
    # closed once written: every working state is unnamed.
    anchor = f"site-a.{plan_settings.federation_id}.chain"
    kept = {path.name for path in tmp_path.iterdir()} - {f"{anchor}.npz"}
    assert len(kept) == 2 and (tmp_path / f"{anchor}.npz").is_file()
    assert sorted(name.rpartition(".")[2] for name in kept if name.startswith(f"{anchor}.")) == ["state", "sum"]
    held = list(open_in_folder())
    assert held and all(target.endswith("(deleted)") for target in held)
    del chain
    assert not list(open_in_folder())


@pytest.mark.usefixtures("on_disk")
def test_on_disk_a_full_disk_is_named_by_the_sites_folder(
    plan_settings: SharedSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    step = Step(plan_settings, None)
    with pytest.raises(OSError) as caught:
        initial = start(step, 11, 7)
        ModelChain("site-a", step.shared, tmp_path, lambda: initial.theta).sent(1, *step.download(initial))
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path)
