"""A site may refuse the auditor a plan's input bound names (issue 80): one line, its own exit status, nothing lost.

The refusal is checked as the plan arrives (`preparation.join`), before anything is sent or recorded; the
aggregator here is a stub that serves a plan declaring the mode.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedfair import cli
from fedfair.core.errors import ConfigError, PermanentFailureError
from fedfair.privacy.ledger_home import LEDGER_DIR_VARIABLE
from fedfair.runtime.collaborator import client
from fedfair.runtime.collaborator.config import CollaboratorConfig, parse_collaborator_config
from fedfair.runtime.collaborator.consent import check_input_bound
from fedfair.runtime.collaborator.preparation import join
from fedfair.runtime.failures import AUDITOR_REFUSED, EXIT_REFUSED, PLAN_MISMATCH
from fedfair.runtime.observe.logs import Console
from fedfair.runtime.plan import aggregator_plan as plan
from fedfair.runtime.transport import WIRE_VERSION, pb
from tests.runtime.test_input_bound import AUDITOR, declared, federation  # noqa: F401 (the fixture)
from tests.runtime.test_manifest import aggregator_plan_with
from tests.runtime.test_plan import CONFIG_TEMPLATE, edited


class Aggregator:
    """Serves one plan's shared settings, as GetPlan does, and counts what it was asked."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.calls = 0

    def GetPlan(self, request: pb.PlanRequest, timeout: float) -> pb.PlanReply:  # noqa: N802 (the RPC's name)
        self.calls += 1
        return pb.PlanReply(settings=self.payload, plan_digest="0" * 64, wire_version=WIRE_VERSION)


class Once:
    """A back-off that calls once (the stub always answers)."""

    def call(self, what: str, call: Callable[[], Any], refuse: object = None) -> Any:
        return call()


def site(folder: Path, manifest: Path | None, **collaborator: Any) -> CollaboratorConfig:
    """hospital-a's config in `folder` (a copy of the template), naming `manifest`."""
    values = {"manifest": str(manifest) if manifest else ..., **collaborator}
    folder.mkdir(exist_ok=True)
    return parse_collaborator_config(edited(CONFIG_TEMPLATE, {"collaborator": values}), folder / "collaborator.toml")


def served(federation: Path) -> Aggregator:  # noqa: F811 (the fixture's folder)
    return Aggregator(plan.shared_settings(declared(aggregator_plan_with(federation))))


def joined(config: CollaboratorConfig, aggregator: Aggregator) -> PermanentFailureError:
    with pytest.raises(PermanentFailureError) as caught:
        join(aggregator, config, Once(), None, None)  # type: ignore[arg-type]
    return caught.value


def test_a_site_that_refuses_the_auditor_says_so_in_one_line_and_loses_nothing(
    federation: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(LEDGER_DIR_VARIABLE, str(tmp_path / "ledgers"))
    folder = tmp_path / "site"
    config = site(folder, federation / "manifest.toml", refuse_auditors=[AUDITOR, "audit-2"])
    assert config.refused_auditors == (AUDITOR, "audit-2")
    aggregator = served(federation)
    error = joined(config, aggregator)
    assert error.failure is AUDITOR_REFUSED
    said = str(error)
    assert "\n" not in said and said.startswith("auditor-refused: ")
    assert f"names '{AUDITOR}' as the auditor of its input bound" in said
    assert f"[collaborator] refuse_auditors in {folder / 'collaborator.toml'} lists it" in said
    # It fetched the plan and nothing else: no record, no ledger, nothing beside its config.
    assert aggregator.calls == 1
    assert not (tmp_path / "ledgers").exists() and list(folder.iterdir()) == []


def test_a_site_that_accepts_the_auditor_consents_and_one_without_a_manifest_is_refused(
    federation: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    config = site(tmp_path / "a", federation / "manifest.toml", refuse_auditors=["audit-2"])
    shared = plan.load_shared_settings(served(federation).payload)
    check_input_bound(shared, config.refused_auditors, config.manifest, config.source)  # nothing refused
    # Without a manifest nothing pins who the auditor is.
    error = joined(site(tmp_path / "b", None), served(federation))
    assert error.failure is PLAN_MISMATCH and "an institution only a manifest can pin" in str(error)
    assert "the aggregator's plan does not fit this collaborator: it names" in str(error)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], r"refuse_auditors must be a non-empty list of auditor names"),
        (["Audit Co"], r"refuse_auditors: invalid participant name 'Audit Co'"),
        ("audit-co", r"refuse_auditors must be a non-empty list of auditor names"),
    ],
)
def test_refuse_auditors_is_a_list_of_names(tmp_path: Path, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        site(tmp_path, None, refuse_auditors=value)
    assert site(tmp_path, None).refused_auditors == ()


@pytest.mark.parametrize(
    ("failure", "status"), [(AUDITOR_REFUSED, EXIT_REFUSED), (PLAN_MISMATCH, 2)], ids=["refused", "mismatch"]
)
def test_the_refusal_exits_with_its_own_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], failure: Any, status: int
) -> None:
    shutil.copy(CONFIG_TEMPLATE, tmp_path / "collaborator.toml")

    class Refusing:
        def __init__(self, config: CollaboratorConfig, reset_state: bool, started: float | None = None) -> None:
            self.config = config

        def stop(self) -> None:
            """The command's stop hook (`stop_on_signals`): nothing here waits."""

        def run(self) -> int:
            raise PermanentFailureError(
                failure, auditor=AUDITOR, config=self.config.source, role="collaborator", reason="a reason"
            )

    monkeypatch.setattr(client, "Collaborator", Refusing)
    # The root logger stays pytest's: a console handler bound to this test's stderr would outlive it, and one
    # an earlier test in this worker left (bound to its closed stream) would print its own errors here.
    monkeypatch.setattr("fedfair.cli.collaborator.configure_logging", lambda **_: None)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler for handler in root.handlers if not isinstance(handler, Console)])
    assert cli.main(["collaborator", "start", "--config", str(tmp_path / "collaborator.toml")]) == status
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fedfair: error: {failure.id}: ")
    assert EXIT_REFUSED not in (0, 1, 2, 3, 130, 141)
