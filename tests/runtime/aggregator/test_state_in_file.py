"""The aggregator's state in a file, read by span, is its state in memory bit for bit (issue 66).

Models, downloads, digests, checkpoints and final models alike; a resume goes on from a state in a file
exactly as from one in memory; a full disk under the state's file is named.
"""

from __future__ import annotations

import errno
import io
import os
import tempfile
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedfair.core import server
from fedfair.core.algorithm import FedSRCVaR
from fedfair.core.config import LocalConfig
from fedfair.runtime import state_files
from fedfair.runtime.aggregator import checkpoint, state
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.output_folder import CHECKPOINT_NAME, FINAL_MODEL_NAME, FINAL_SUMMARY_NAME
from fedfair.runtime.aggregator.checkpoint import (
    Checkpoint,
    export_final_model,
    load_checkpoint,
    read_round_log,
    save_checkpoint,
    state_digest,
)
from fedfair.runtime.aggregator.start import run_aggregator
from fedfair.runtime.aggregator.state import AggregatorState, output_values, placed, step, training_values
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.core.update import update_dimension
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, load_aggregator_plan, plan_digest
from fedfair.runtime.state_files import InFile, holding
from tests.runtime.harness import new_workspace

PLAN = "d" * 64
NAMES = ["site-a", "site-b", "site-c"]


def values_of(state: AggregatorState, field: str) -> np.ndarray:
    """The tensor `field` of a state, read whole."""
    held = holding(state)
    length = held.dimension + (1 if field in ("control", "velocity") else 0)
    return np.concatenate([held.values(field, start, stop) for start, stop in held.spans(length)])


def values(state: AggregatorState) -> dict[str, object]:
    """Every value of a state, its tensors as bytes: equal exactly when the states are equal bit for bit."""
    held = holding(state)
    scalars = {name: getattr(held, name) for name in ("round", "c", "c_average", "averaged_rounds")}
    tensors = {}
    for name in held.fields:
        length = held.dimension + (1 if name in ("control", "velocity") else 0)
        tensors[name] = b"".join(held.values(name, start, stop).tobytes() for start, stop in held.spans(length))
    return scalars | tensors


def content(path: Path) -> dict[str, Any]:
    """A checkpoint's or final model's payload as torch.load reads it (past a checkpoint's digest line)."""
    data = path.read_bytes()
    if not data.startswith(b"PK"):
        data = data.partition(b"\n")[2]
    loaded: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True)
    return loaded


def same(left: Any, right: Any) -> bool:
    """Whether two payloads are equal, tensors bit for bit."""
    if isinstance(left, dict):
        return isinstance(right, dict) and left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and left.dtype == right.dtype and torch.equal(left, right)
    return bool(left == right)


@settings(max_examples=30, deadline=None)
@given(
    piece=st.integers(2, 6),
    dimension=st.integers(2, 30),
    drift=st.booleans(),
    mover=st.sampled_from(["plain", "momentum", "adam"]),
    average_from=st.integers(0, 2),
    rounds=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_a_state_in_a_file_steps_downloads_digests_and_checkpoints_as_in_memory(
    piece: int,
    dimension: int,
    drift: bool,
    mover: str,
    average_from: int,
    rounds: int,
    seed: int,
) -> None:
    assume(dimension % piece)  # never a multiple of the piece: the last one is short
    algorithm = FedSRCVaR(
        local=LocalConfig(drift_correction="scaffold" if drift else "none"),
        bound=2.0,
        momentum=0.9 if mover == "momentum" else 0.0,
        adam=server.Adam(lr=0.01) if mover == "adam" else None,
    )
    generator = np.random.default_rng(seed)
    theta = torch.from_numpy(generator.standard_normal(dimension).astype(np.float32).astype(np.float64))
    memory: AggregatorState = algorithm.server_init(theta)
    with (
        tempfile.TemporaryDirectory() as scratch,
        mock.patch.object(state_files, "PIECE", piece),
        mock.patch.object(state_files, "IN_FILE_FROM", 0),
    ):
        tmp_path = Path(scratch)
        in_file = placed(algorithm.server_init(theta.clone()), algorithm, tmp_path)
        assert isinstance(in_file, InFile) and values(in_file) == values(memory)
        for _ in range(rounds):
            weighted = generator.uniform(-0.5, 0.5, update_dimension(dimension, drift))
            memory = step(memory, weighted, 3.0, algorithm, average_from, tmp_path)
            in_file = step(in_file, weighted.copy(), 3.0, algorithm, average_from, tmp_path)
            assert isinstance(memory, server.ServerState) and isinstance(in_file, InFile)
            assert values(in_file) == values(memory) and state_digest(in_file) == state_digest(memory)
            for builtin in (True, False):
                assert np.array_equal(training_values(in_file, builtin), training_values(memory, builtin))
                assert np.array_equal(output_values(in_file, builtin), output_values(memory, builtin))
        for name, kept_state in (("memory", memory), ("file", in_file)):
            (tmp_path / name).mkdir()
            save_checkpoint(tmp_path / name, Checkpoint(rounds, kept_state, PLAN, {"worst_risk": 0.5}))
            export_final_model(tmp_path / name, Checkpoint(rounds, kept_state, PLAN), {"aborted_rounds": 0})
        for name in (CHECKPOINT_NAME, FINAL_MODEL_NAME):
            assert same(content(tmp_path / "file" / name), content(tmp_path / "memory" / name))
        summaries = [(tmp_path / folder / FINAL_SUMMARY_NAME).read_text() for folder in ("file", "memory")]
        assert summaries[0] == summaries[1]
        # Either checkpoint, read by span into a file, is the state a resume goes on with, bit for bit.
        for name in ("memory", "file"):
            loaded = load_checkpoint(tmp_path / name, PLAN)
            assert isinstance(loaded.state, InFile) and loaded.round == rounds
            saved = values(memory)
            saved.pop("second_moment", None)  # FedAdam's second moment is not checkpointed
            assert values(loaded.state) == saved


def test_a_full_disk_under_the_state_file_is_named_by_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    algorithm = FedSRCVaR(local=LocalConfig(), momentum=0.9)
    state = algorithm.server_init(torch.linspace(-1.0, 1.0, 11, dtype=torch.float64))
    monkeypatch.setattr(os, "pwrite", full)
    with mock.patch.object(state_files, "IN_FILE_FROM", 0), pytest.raises(OSError) as caught:
        placed(state, algorithm, tmp_path)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path)


def federation(tmp_path: Path, *, resume: bool) -> tuple[AggregatorPlan, list[dict[str, Any]], list[int]]:
    """A federation of 3 rounds under server momentum, secure and fresh, or on plain sums and resumed from round 0's state checkpointed
    as round 1's (written from a file): its plan, the aggregator's round log and the sites' exit codes."""
    # A resume from a checkpoint written here is plain sums: under verified secure aggregation fresh sites hold no
    # anchor for round 1, so they sit out the models sent from round 2 on (the closed chain, docs/security.md).
    secure = {"enabled": not resume}
    workspace = new_workspace(
        tmp_path, NAMES, training={"rounds": 3, "server_momentum": 0.9}, secure_aggregation=secure
    )
    plan = load_aggregator_plan(workspace.plan)
    if resume:
        output = plan.aggregator.output
        output.mkdir(parents=True, exist_ok=True)
        start = placed(initial_state(plan), plan.algorithm(), output)
        save_checkpoint(output, Checkpoint(1, start, plan_digest(plan)))
    collaborators = [
        Collaborator(load_collaborator_config(path), reset_state=resume) for path in workspace.configs.values()
    ]
    with ThreadPoolExecutor(max_workers=len(NAMES)) as pool:
        try:
            finished = [pool.submit(collaborator.run) for collaborator in collaborators]
            run_aggregator(plan, resume=resume)
            codes = [done.result(timeout=60) for done in finished]
        finally:
            for collaborator in collaborators:
                collaborator.stop()
    return plan, read_round_log(plan.aggregator.output), codes


@pytest.fixture
def aggregator_in_file() -> Iterator[None]:
    """The aggregator keeps its state in a file, read by 5 coordinates, and reads any checkpoint by span; the
    sites' chains stay in memory, so each site checks the aggregator's models against the step taken whole."""
    with (
        mock.patch.object(state, "held_in_file", lambda *_: True),
        mock.patch.object(checkpoint, "large", lambda _: True),
        mock.patch.object(state_files, "PIECE", 5),
    ):
        yield


@pytest.mark.slow
@pytest.mark.usefixtures("aggregator_in_file")
def test_every_site_verifies_the_models_of_an_aggregator_whose_state_is_in_a_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """About 5 s: each site applies the plan's step, whole and in memory, to every sum it verified and takes the
    next model and the output model only if they are that state's bit for bit (its model chain)."""
    plan, log, codes = federation(tmp_path, resume=False)
    assert [record["status"] for record in log] == ["applied"] * 3 and codes == [0, 0, 0]
    assert "cannot check" not in caplog.text
    assert isinstance(load_checkpoint(plan.aggregator.output, plan_digest(plan)).state, InFile)


@pytest.mark.slow
@pytest.mark.usefixtures("aggregator_in_file")
def test_a_resume_goes_on_from_the_checkpointed_state_read_into_a_file(tmp_path: Path) -> None:
    """About 5 s: round 2 starts from the checkpoint's state exactly (its digest), and the final checkpoint,
    read back by span, is the final model the aggregator exported."""
    plan, log, _ = federation(tmp_path, resume=True)
    assert [record["round"] for record in log] == [2, 3] and [record["status"] for record in log] == ["applied"] * 2
    assert log[0]["model_sha256"] == state_digest(initial_state(plan))
    output = plan.aggregator.output
    final = load_checkpoint(output, plan_digest(plan))
    assert isinstance(final.state, InFile) and final.round == 3
    exported = content(output / FINAL_MODEL_NAME)
    assert np.array_equal(exported["theta"].numpy(), values_of(final.state, "theta"))
    assert np.array_equal(exported["theta_average"].numpy(), values_of(final.state, "theta_average"))
    summary = json.loads((output / FINAL_SUMMARY_NAME).read_text())
    assert summary["model_sha256"] == state_digest(final.state)
