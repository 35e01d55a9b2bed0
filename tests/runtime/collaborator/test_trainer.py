"""The collaborator's privacy state per federation, and what it tells the aggregator about its budget.

The aggregator side here is a recording servicer behind the real mTLS server credentials
on loopback: it serves the plan and keeps every StatusReport, so the test sees exactly
what a collaborator sends (a status, never a reason string).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pandas as pd
import pytest
import torch

from fedfair.core.data import ClientData
from fedfair.core.errors import ConfigError, PermanentFailureError
from fedfair.privacy.learner import PrivateLearner
from fedfair.privacy.ledger_home import ledger_folder
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.collaborator import client as client_module
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.datasets.schema import Column, Schema
from fedfair.runtime.collaborator.config import DataSettings, load_collaborator_config
from fedfair.runtime.peer.retries import RetryPolicy
from fedfair.runtime.collaborator.trainer import (
    LocalData,
    LocalTable,
    check_schema_table,
    build_learner,
    load_local_data,
    round_trainer,
)
from fedfair.runtime.failures import EXIT_INCOMPLETE, PLAN_CHANGED
from fedfair.runtime.local.workspace import Workspace, declared_sizes, make_workspace, toml_text, write_pinned_manifest
from fedfair.runtime.plan.aggregator_plan import (
    load_aggregator_plan,
    load_shared_settings,
    plan_digest,
    shared_settings,
)
from fedfair.runtime.transport import (
    WIRE_VERSION,
    TlsFiles,
    make_binding,
    pb,
    pb_grpc,
    secure_channel,
    server_credentials,
)
from fedfair.pki.roster import settings_digest
from tests.runtime.harness import new_workspace, plan_sections
from tests.runtime.wire_stages import WIRE

NAMES = ["site-a", "site-b"]


class Recorder(pb_grpc.FederationServicer):
    """Serves the plan and records the status reports (nothing else is needed here)."""

    def __init__(self, settings: bytes, digest: str) -> None:
        self.settings, self.digest = settings, digest
        self.reports: list[pb.StatusReport] = []

    def GetPlan(self, request: pb.PlanRequest, context: grpc.ServicerContext) -> pb.PlanReply:
        return pb.PlanReply(
            binding=request.binding, settings=self.settings, plan_digest=self.digest, wire_version=WIRE_VERSION
        )

    def Report(self, request: pb.StatusReport, context: grpc.ServicerContext) -> pb.Receipt:
        self.reports.append(request)
        return pb.Receipt(binding=request.binding)


@contextmanager
def serving(workspace: Workspace) -> Iterator[Recorder]:
    """A Recorder serving the workspace's plan behind the aggregator's mTLS credentials."""
    plan = load_aggregator_plan(workspace.plan)
    recorder = Recorder(shared_settings(plan), plan_digest(plan))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_FederationServicer_to_server(recorder, server)  # type: ignore[no-untyped-call]
    server.add_secure_port(workspace.address, server_credentials(TlsFiles.in_folder(workspace.certs, "aggregator")))
    server.start()
    try:
        yield recorder
    finally:
        server.stop(0)


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[tuple[Workspace, Recorder]]:
    # Noised answers: a site with its own DP-SGD refuses a secure plan whose answers decode exact.
    workspace = new_workspace(tmp_path, NAMES, privacy={"report_epsilon": 1.0})
    with serving(workspace) as recorder:
        yield workspace, recorder


def with_privacy(path: Path, **privacy: object) -> Path:
    path.write_text(path.read_text() + toml_text({"privacy": {"enabled": True, **privacy}}))
    return path


def private_rounds(workspace: Workspace, name: str, rounds: int) -> Collaborator:
    """A collaborator that fetched the plan and ran `rounds` rounds of training, as a TRAIN task would."""
    collaborator = Collaborator(load_collaborator_config(workspace.configs[name]))
    files = TlsFiles.in_folder(workspace.certs, name)
    with secure_channel(workspace.address, files, aggregator_name="aggregator") as channel:
        stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
        collaborator.setup(stub)
        theta = initial_state(load_aggregator_plan(workspace.plan)).theta
        for round_number in range(1, rounds + 1):
            binding = make_binding("fedfair-launch", round_number, WIRE["STAGE_TRAIN"])
            collaborator.train_on(stub, binding, "model", theta, 5.0)
    return collaborator


def test_once_set_up_a_collaborator_keeps_its_own_rows_not_the_whole_dataset(
    recorded: tuple[Workspace, Recorder],
) -> None:
    """The dataset read before dialing is let go once this institution's part is cut from it: 51 sites
    on one machine would otherwise each hold the whole table beside their part."""
    workspace, _ = recorded
    collaborator = Collaborator(load_collaborator_config(workspace.configs[NAMES[0]]))
    whole = collaborator._table.dataset if collaborator._table is not None else None
    assert whole is not None
    files = TlsFiles.in_folder(workspace.certs, NAMES[0])
    with secure_channel(workspace.address, files, aggregator_name="aggregator") as channel:
        collaborator.setup(pb_grpc.FederationStub(channel))  # type: ignore[no-untyped-call]
    assert collaborator._table is None
    assert 0 < collaborator.data.train.size < len(whole.y_train)


@pytest.mark.slow
def test_a_spent_budget_is_reported_as_a_status(
    recorded: tuple[Workspace, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    workspace, recorder = recorded
    with_privacy(workspace.configs["site-a"], noise_multiplier=1.0, budget_epsilon=1e-3)
    with caplog.at_level(logging.INFO):
        private_rounds(workspace, "site-a", 2)
    assert [(report.status, report.HasField("epsilon")) for report in recorder.reports] == [
        (pb.COLLABORATOR_STATUS_BUDGET_SPENT, False)
    ] * 2
    assert [report.binding.round for report in recorder.reports] == [1, 2]
    assert caplog.text.count("site-a stops contributing") == 2


def test_shared_epsilon_is_reported_each_round_and_logged_once(
    recorded: tuple[Workspace, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    workspace, recorder = recorded
    with_privacy(workspace.configs["site-b"], noise_multiplier=1.0, share_epsilon=True)
    with caplog.at_level(logging.INFO):
        collaborator = private_rounds(workspace, "site-b", 2)
    assert isinstance(collaborator.trainer, PrivateLearner) and collaborator.trainer.last_report is not None
    statuses = [report.status for report in recorder.reports]
    assert statuses == [pb.COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT] * 2
    assert recorder.reports[1].epsilon == collaborator.trainer.last_report.epsilon > recorder.reports[0].epsilon > 0
    assert caplog.text.count("site-b: epsilon ") == 2  # one privacy line per round


@pytest.mark.slow
def test_the_privacy_state_is_kept_per_dataset_across_federations(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = new_workspace(tmp_path, NAMES)
    config = load_collaborator_config(with_privacy(workspace.configs["site-a"], noise_multiplier=1.0))
    plan = load_aggregator_plan(workspace.plan)
    shared = load_shared_settings(shared_settings(plan))
    theta = initial_state(plan).theta
    folder = config.source.parent
    (folder / "site-a.old.privacy.json").write_text(
        '{"format": "fedfair-privacy-accountant", "version": 2, "federation": "old", "rounds": 1, '
        '"history": [[1.0, 0.01, 7]]}'
    )

    def train(federation: str) -> PrivateLearner:
        settings = load_shared_settings(shared_settings(plan).replace(b"fedfair-launch", federation.encode()))
        learner = build_learner(load_local_data(config, shared), settings, torch.device("cpu"), name=config.name)
        trainer = round_trainer(learner, config, settings)
        assert isinstance(trainer, PrivateLearner)
        trainer.train_round(theta, 5.0)
        return trainer

    with caplog.at_level(logging.WARNING):
        trainer = train("federation-1")
    assert "the DP-SGD history of federation old was kept in its own file; folded into" in caplog.text
    tau = trainer.steps_per_round
    assert trainer.accountant.rounds == 1 and trainer.accountant.steps == 7 + tau
    assert train("federation-1").accountant.rounds == 2  # a restart in the same federation keeps its history
    other = train("federation-2").accountant  # another federation with the same data continues it
    assert other.rounds == 1 and other.steps == 7 + 3 * tau
    # One history, beside the data's ledger in the institution's ledger folder; the file of before stays as it was.
    assert [path.name for path in ledger_folder().glob("*.privacy.json")] == [other.path.name]  # type: ignore[union-attr]
    assert [path.name for path in folder.glob("*.privacy.json")] == ["site-a.old.privacy.json"]


def one_row_fewer(data: LocalData) -> LocalData:
    train = data.train
    return dataclasses.replace(data, train=ClientData(train.name, train.features[1:], train.labels[1:]))


@pytest.mark.slow
def test_under_dp_neighbouring_datasets_send_the_same_weight_and_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Everything a DP collaborator releases outside the noise is a constant of the plan.

    With batch_fraction 1 the batch and weight used to be the row count itself (n and n - 1 for
    two datasets one row apart), released outside the noise while the accountant counted only
    the noised sum. Declared in the plan, both are the same for the two neighbours.
    """
    sizes = declared_sizes(
        {name: {"dataset": "adult", "partition": "race", "index": i} for i, name in enumerate(NAMES)}, 0
    )
    assert sizes is not None
    declared = {**sizes, "site-a": sizes["site-a"] - 1}  # a neighbour may hold one row fewer than it declares
    workspace = new_workspace(
        tmp_path / "plan",
        NAMES,
        training={"batch_fraction": 1.0},
        influence={"weights": "declared", "sizes": declared},
        privacy={"report_epsilon": 1.0},  # noised answers beside the site's own DP-SGD
    )
    plan = load_aggregator_plan(workspace.plan)
    original = client_module.load_local_data
    sent: dict[str, tuple[float, int, int]] = {}
    said: dict[str, str | None] = {}
    with serving(workspace):
        for neighbour, load in (("D", original), ("D'", lambda *args: one_row_fewer(original(*args)))):
            folder = tmp_path / neighbour
            folder.mkdir()
            config_path = folder / "collaborator.toml"
            config_path.write_text(workspace.configs["site-a"].read_text())
            with_privacy(config_path, noise_multiplier=1.0)
            # Two institutions, each with its own ledger folder: one institution's two folders of the same data in
            # the same federation share its DP-SGD accountant, and the second is refused as a lost record.
            monkeypatch.setenv("FEDFAIR_LEDGER_DIR", str(folder / "ledgers"))
            monkeypatch.setattr(client_module, "load_local_data", load)
            collaborator = Collaborator(load_collaborator_config(config_path))
            files = TlsFiles.in_folder(workspace.certs, "site-a")
            with secure_channel(workspace.address, files, aggregator_name="aggregator") as channel:
                stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
                collaborator.setup(stub)
                binding = make_binding("fedfair-launch", 1, WIRE["STAGE_TRAIN"])
                trained = collaborator.train_on(stub, binding, "model", initial_state(plan).theta, 5.0)
            assert isinstance(collaborator.trainer, PrivateLearner) and collaborator.learner is not None
            assert trained.vector is not None
            sent[neighbour] = (trained.weight, collaborator.learner.batch_size, collaborator.learner.num_samples)
            assert collaborator.trainer.last_report is not None
            said[neighbour] = collaborator.trainer.last_report.released
    rows = sizes["site-a"]
    assert sent["D"][2] == rows and sent["D'"][2] == rows - 1  # the neighbours really differ by one row
    assert sent["D"][:2] == sent["D'"][:2] == (float(rows - 1), rows - 1)
    # The privacy report says which numbers leave outside the noise, and that the plan fixes them.
    assert (
        said["D"]
        == said["D'"]
        == (
            f"weight {rows - 1} and expected batch {rows - 1}, fixed by the plan ([influence] declared weights, "
            f"declared size {rows - 1}), not by the rows held"
        )
    )


def test_dp_refuses_a_plan_that_declares_no_size(tmp_path: Path) -> None:
    workspace = new_workspace(tmp_path, NAMES, influence={"weights": "equal"})
    config = load_collaborator_config(with_privacy(workspace.configs["site-a"], noise_multiplier=1.0))
    shared = load_shared_settings(shared_settings(load_aggregator_plan(workspace.plan)))
    learner = build_learner(load_local_data(config, shared), shared, torch.device("cpu"), name=config.name)
    with pytest.raises(ConfigError, match=r"declares no size for site-a, so the batch and weight would reveal its row"):
        round_trainer(learner, config, shared)


@pytest.mark.parametrize("fraction", [0.1, 0.4])
def test_a_table_holds_out_the_share_its_data_section_names(tmp_path: Path, fraction: float) -> None:
    """[data] test_fraction is the share of a csv table's rows held out for the federated evaluation."""
    workspace = new_workspace(tmp_path, NAMES)
    config = load_collaborator_config(workspace.configs[NAMES[0]])
    table = pd.DataFrame({"age": np.arange(200) % 70 + 18.0, "y": np.where(np.arange(200) % 3 == 0, "yes", "no")})
    path = tmp_path / "table.csv"
    table.to_csv(path, index=False)
    config = dataclasses.replace(config, data=DataSettings(csv=path, label="y", test_fraction=fraction))
    schema = Schema(label="y", classes=("no", "yes"), columns=(Column("age", "numeric"),), missing="refuse")
    shared = load_shared_settings(shared_settings(load_aggregator_plan(workspace.plan)))
    split = check_schema_table(config, dataclasses.replace(shared, schema=schema), LocalTable(None, table))
    assert len(split.test) == round(fraction * 200) and len(split.train) + len(split.test) == 200


class ChangingPlan(Recorder):
    """Serves the plan; once a task stream opens, the operator has edited the plan: the stream's task and
    every later GetPlan carry the new digest, until `rollback_after` more fetches (None: never)."""

    def __init__(self, settings: bytes, digest: str, rollback_after: int | None, edited: bytes | None) -> None:
        super().__init__(settings, digest)
        self.original, self.rollback_after, self.streams = (settings, digest), rollback_after, 0
        self.edited = settings if edited is None else edited

    def GetPlan(self, request: pb.PlanRequest, context: grpc.ServicerContext) -> pb.PlanReply:
        if self.streams and self.rollback_after is not None:
            self.rollback_after -= 1
            if self.rollback_after < 0:
                self.settings, self.digest = self.original
        return super().GetPlan(request, context)

    def WaitForTasks(self, request: pb.TaskRequest, context: grpc.ServicerContext) -> Iterator[pb.Task]:
        self.streams += 1
        if self.streams == 1:
            self.settings, self.digest = self.edited, "another"
            binding = make_binding(request.after.federation_id, 1, WIRE["STAGE_TRAIN"])
            yield pb.Task(binding=binding, action=pb.ACTION_RUN, deadline_seconds=30.0, plan_digest="another")
        else:
            binding = make_binding(request.after.federation_id, 1, WIRE["STAGE_EVAL_UNMASK"])
            yield pb.Task(binding=binding, action=pb.ACTION_FINISHED, plan_digest=self.digest)


@contextmanager
def changing_plan(
    workspace: Workspace, rollback_after: int | None, edited: bytes | None = None
) -> Iterator[ChangingPlan]:
    """A ChangingPlan behind the aggregator's mTLS credentials; `edited`: the settings served after the edit."""
    plan = load_aggregator_plan(workspace.plan)
    servicer = ChangingPlan(shared_settings(plan), plan_digest(plan), rollback_after, edited)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_FederationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    server.add_secure_port(workspace.address, server_credentials(TlsFiles.in_folder(workspace.certs, "aggregator")))
    server.start()
    try:
        yield servicer
    finally:
        server.stop(0)


QUICK = RetryPolicy(max_wait_seconds=1.0, base_seconds=0.05, cap_seconds=0.1)


def test_a_plan_changed_under_a_waiting_collaborator_is_waited_out_then_stops_it_with_one_consistent_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It leaves the task stream, logs one line per attempt (no traceback), and stops with plan-changed
    once [retry] max_wait_seconds has passed; the message's fix agrees with its first sentence."""
    workspace = new_workspace(tmp_path, NAMES)
    caplog.set_level(logging.WARNING, "fedfair.collaborator")
    with changing_plan(workspace, rollback_after=None) as servicer, pytest.raises(PermanentFailureError) as stopped:
        Collaborator(load_collaborator_config(workspace.configs[NAMES[0]]), retry=QUICK).run()
    message = str(stopped.value)
    assert stopped.value.failure is PLAN_CHANGED and message.startswith("plan-changed: the plan changed: ")
    assert "fedfair plan pin" in message and "fedfair plan diff OLD NEW" in message
    assert "starts this collaborator again" in message and "ask the operator which fedfair version" not in message
    waits = [record.getMessage() for record in caplog.records if "plan-changed: " in record.getMessage()]
    assert len(waits) >= 2 and all("; retry " in line for line in waits)
    assert all(record.exc_info is None for record in caplog.records)
    assert servicer.streams == 1  # no task stream while it waits: the aggregator does not count it in


def test_a_collaborator_follows_the_stream_again_when_the_plan_is_rolled_back(tmp_path: Path) -> None:
    workspace = new_workspace(tmp_path, NAMES)
    with changing_plan(workspace, rollback_after=2) as servicer:
        # It reaches FINISHED; the stub runs no round, so the site's update is in none: not a plain success.
        assert Collaborator(load_collaborator_config(workspace.configs[NAMES[0]]), retry=QUICK).run() == EXIT_INCOMPLETE
    assert servicer.streams == 2


def test_a_pinned_collaborator_names_the_served_digest_and_the_fields_that_changed(tmp_path: Path) -> None:
    """The operator edited the plan (--rounds 5 over the pinned 2) and restarted the aggregator under a
    joined collaborator: it stops naming the served settings' digest and the field, against its pin."""
    workspace = make_workspace(tmp_path, NAMES, plan=plan_sections(training={"rounds": 2}), manifest=True)
    edited = shared_settings(load_aggregator_plan(workspace.plan, {"training": {"rounds": 5}}, check_manifest=False))
    with changing_plan(workspace, rollback_after=None, edited=edited), pytest.raises(PermanentFailureError) as stopped:
        Collaborator(load_collaborator_config(workspace.configs[NAMES[0]]), retry=QUICK).run()
    message = str(stopped.value)
    served = settings_digest(json.loads(edited))
    assert message.startswith(
        f"plan-changed: the plan changed: the aggregator now serves the plan with settings sha256 {served}"
    )
    assert "pinned -> served: training.rounds: 2 -> 5" in message and "fedfair plan pin" in message


def test_a_table_that_misfits_the_pinned_schema_stops_the_collaborator_before_it_dials(tmp_path: Path) -> None:
    """With the plan pinned in its manifest, a collaborator checks its table before any connection (no
    aggregator runs here)."""
    table = pd.DataFrame({"age": ["30", "forty"], "colour": ["red", "blue"], "y": ["no", "maybe"]})
    path = tmp_path / "table.csv"
    table.to_csv(path, index=False)
    workspace = new_workspace(tmp_path / "federation", NAMES)
    schema = Schema(
        label="y",
        classes=("no", "yes"),
        columns=(Column("age", "numeric"), Column("color", "categorical", ("red", "blue"))),
        missing="refuse",
    )
    workspace.plan.write_text(workspace.plan.read_text() + "\n" + schema.to_toml())
    manifest = tmp_path / "federation" / "manifest.toml"
    write_pinned_manifest(manifest, workspace.plan, workspace.certs)
    config_path = workspace.configs[NAMES[0]]
    text = config_path.read_text().replace("[collaborator]\n", f'[collaborator]\nmanifest = "{manifest}"\n', 1)
    data_start = text.index("[data]")
    data_end = text.find("\n[", data_start + 1)
    config_path.write_text(
        text[:data_start] + f'[data]\ncsv = "{path}"\n' + (text[data_end + 1 :] if data_end != -1 else "")
    )
    with pytest.raises(PermanentFailureError) as stopped:
        Collaborator(load_collaborator_config(config_path))
    message = str(stopped.value)
    assert message.startswith("data-mismatch: ")
    assert "has no column 'color', which the plan's [schema] requires; did you mean 'colour'?" in message


def test_a_collaborator_without_privacy_does_not_load_opacus() -> None:
    """Opacus and the scipy it brings (about 120 MB of a collaborator's memory) load only with [privacy]."""
    probe = (
        "import sys\n"
        "import fedfair.cli.collaborator\n"
        "print(sorted(name for name in ('opacus', 'scipy') if name in sys.modules))\n"
    )
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert completed.stdout.strip().splitlines()[-1] == "[]"
