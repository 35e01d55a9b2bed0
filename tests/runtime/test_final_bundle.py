"""The final model bundle a collaborator keeps, over real gRPC and mutual TLS (issue 51, item 1).

fedfair's own aggregator runs in a thread with one change: the bundle its FINISHED task offers is rewritten
(:class:`Board` ``finish`` patched). A forged bundle of another federation goes to three collaborators: one a
real ``fedfair collaborator start`` process (its exit status and console), two `Collaborator`s in threads of
the test (their error and log lines; two process start-ups spared): each refuses it and keeps nothing. A
bundle whose provenance claims
every round for a site that sent no update goes to a site in a thread: the bundle's model checks out, but the
site counts only what its own record holds.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from fedfair.bundle import load_bundle, write_bundle
from fedfair.core.errors import PermanentFailureError
from fedfair.core.update import Update
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.aggregator.start import run_aggregator
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.trainer import round_trainer
from fedfair.runtime.local.processes import start_collaborator
from fedfair.runtime.local.workspace import Workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.transport import pb
from tests.runtime.harness import new_workspace, thread_federation

pytestmark = pytest.mark.slow

NAMES = ["site-a", "site-b", "site-c"]
ROUNDS = 2
FORGED_FEDERATION = "fed"


def rewritten(payload: bytes, folder: Path, *, federation: str | None = None) -> bytes:
    """The bundle `payload` with its provenance claiming every round for every site, and under `federation`."""
    source = folder / "honest.pt"
    source.write_bytes(payload)
    bundle = load_bundle(source)
    plan = dict(bundle.plan)
    if federation is not None:
        plan["federation"] = {**plan["federation"], "id": federation}
    provenance = {**bundle.provenance, "contributions": dict.fromkeys(NAMES, ROUNDS)}
    forged = folder / "forged.pt"
    write_bundle(forged, dataclasses.replace(bundle, plan=plan, provenance=provenance))
    return forged.read_bytes()


@contextmanager
def finishing_with(monkeypatch: pytest.MonkeyPatch, forge: Callable[[bytes], bytes]) -> Iterator[list[bytes]]:
    """Board.finish offers `forge(the honest bundle)` instead; yields the bundles offered."""
    offered: list[bytes] = []
    finish = Board.finish

    def forged(board: Board, binding: pb.Binding, payload: bytes = b"") -> None:
        offered.append(forge(payload))
        finish(board, binding, offered[-1])

    monkeypatch.setattr(Board, "finish", forged)
    yield offered


def kept_bundle(workspace: Workspace, name: str, federation: str) -> Path:
    return workspace.configs[name].parent / f"{name}.{federation}.model_bundle.pt"


def test_collaborator_processes_refuse_another_federations_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The forged bundle holds this federation's very model; only its federation id and provenance differ."""
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": ROUNDS}, quorum={"min_collaborators": 3})
    plan = load_aggregator_plan(workspace.plan)
    log = io.StringIO()
    summary: dict[str, Any] = {}
    threads = {name: Collaborator(load_collaborator_config(workspace.configs[name])) for name in NAMES[1:]}
    with (
        finishing_with(monkeypatch, lambda payload: rewritten(payload, tmp_path, federation=FORGED_FEDERATION)),
        caplog.at_level(logging.INFO, logger="fedfair"),
        ThreadPoolExecutor(max_workers=len(threads), thread_name_prefix="test-collaborator") as pool,
    ):
        aggregator = threading.Thread(target=lambda: summary.update(run_aggregator(plan)), daemon=True)
        aggregator.start()
        child = start_collaborator(workspace, NAMES[0], sink=log)
        runs = {name: pool.submit(collaborator.run) for name, collaborator in threads.items()}
        try:
            status = child.wait(180)
            errors = {name: run.exception(timeout=180) for name, run in runs.items()}
        finally:
            child.kill()
            for collaborator in threads.values():
                collaborator.stop()
        aggregator.join(60)
    assert summary.get("aborted_rounds") == 0, log.getvalue()[-3000:]
    assert status == 2, log.getvalue()[-3000:]
    said = {NAMES[0]: "\n".join(child.lines)}
    for name, error in errors.items():
        assert isinstance(error, PermanentFailureError), error
        said[name] = "\n".join(line for line in caplog.text.splitlines() if f" {name}: " in line) + f"\n{error}"
    counted = f"by its own record, its model holds this institution's update in {ROUNDS} of {ROUNDS} rounds"
    for name, text in said.items():
        assert "bundle-refused: " in text and f"federation {FORGED_FEDERATION!r}" in text, text[-2000:]
        # The closing count is the site's own (it sent both rounds), said before the refusal.
        assert counted in text, text[-2000:]
        for federation in (plan.federation_id, FORGED_FEDERATION):
            assert not kept_bundle(workspace, name, federation).exists()
        assert not list(workspace.configs[name].parent.glob("*.unchecked"))


class NaNUpdates:
    """A trainer whose every update is NaN: the collaborator withdraws from every training round."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update:
        update = self.trainer.train_round(theta, c)
        return Update(delta=update.delta * float("nan"), delta_c=update.delta_c, weight=update.weight)


def test_the_count_and_exit_status_come_from_the_sites_own_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """site-c sends no update in any round; the bundle's provenance says it did in both. site-c counts 0 of 2
    rounds from its own record; it checks each model by catching up on the sums it missed (issue 98), so it keeps
    the bundle too, and ends with exit 3 ([quorum] aborted_rounds_allowed = 0), the others with 0."""
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": ROUNDS}, quorum={"min_collaborators": 3})

    def break_c(name: str, collaborator: Collaborator) -> None:
        if name == "site-c":
            collaborator.trainer_factory = lambda *args: NaNUpdates(round_trainer(*args))

    caplog.set_level("INFO", "fedfair.collaborator")
    with (
        finishing_with(monkeypatch, lambda payload: rewritten(payload, tmp_path)) as offered,
        thread_federation(workspace, collaborator=break_c) as federation,
    ):
        federation.join(180)
    assert not federation.errors, federation.errors
    assert "site-c: round 1: caught up" in caplog.text
    assert load_bundle_bytes(offered[0], tmp_path).provenance["contributions"]["site-c"] == ROUNDS
    assert federation.exits == {"site-a": 0, "site-b": 0, "site-c": 3}, federation.exits
    closing = f"by its own record, its model holds this institution's update in 0 of {ROUNDS} rounds"
    assert f"site-c: the federation has finished, but {closing}" in caplog.text
    for name in NAMES:
        assert kept_bundle(workspace, name, federation.plan.federation_id).read_bytes() == offered[0], name


def load_bundle_bytes(payload: bytes, folder: Path) -> Any:
    path = folder / "offered.pt"
    path.write_bytes(payload)
    return load_bundle(path)
