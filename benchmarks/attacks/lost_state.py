"""State that cannot silently reset: the target's record or its privacy ledger lost, then restarted.

Rows of the record scenario (:mod:`attacks.record`), with a control where the honest path works:

- lost record: the real ``fedfair aggregator start`` past round 1, two sites in threads and the target
  as a real ``fedfair collaborator start`` process; once the target trained two rounds it is stopped,
  its ``NAME.FED.bindings.json`` deleted and it is started again: exit status 2 with
  ``local-state-lost``; with ``--reset-state`` it joins and trains (the control);
- lost ledger: the same with ``[privacy]`` on, the privacy accountant deleted and the record kept: exit
  status 2 naming the accountant (:meth:`~fedfair.runtime.collaborator.input_record.InputRecord.check_accountant`);
  with the accountant restored from its backup it trains again (the control).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from attacks.pinned_federation import FEDERATION_ID, wait_until
from attacks.federation import HonestCollaborators
from attacks.target_site import TARGET, THREE, PROCESS_SECONDS, real, bindings_path, trainings, process_federation_plan
from attacks.rows import RowBook
from fedfair.runtime.local.processes import Child, child_environment, collaborator_command, start_aggregator
from fedfair.privacy.accounting import privacy_state_path
from fedfair.privacy.ledger_home import ledger_folder
from fedfair.runtime.collaborator.charges import data_identity
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import Workspace, declared_sizes, make_workspace


@dataclass
class TargetFederation:
    """The real aggregator process (1,000 rounds: it stays past round 1 throughout), two sites in threads, and
    `TARGET` as real collaborator processes started by :meth:`start`, one after another."""

    workspace: Workspace
    children: list[Child] = field(default_factory=list)
    log: io.StringIO = field(default_factory=io.StringIO)

    def start(self, *extra: str) -> Child:
        """A `fedfair collaborator start` process of TARGET, with `extra` arguments."""
        command = [*collaborator_command(self.workspace, TARGET), *extra]
        self.children.append(Child(TARGET, command, env=child_environment(None), sink=self.log))
        return self.children[-1]

    def trained(self, rounds: int) -> bool:
        """Whether TARGET's record counts at least `rounds` trainings within PROCESS_SECONDS."""
        return wait_until(lambda: (trainings(self.workspace, TARGET) or 0) >= rounds, PROCESS_SECONDS)

    def refused(self, child: Child, word: str) -> tuple[int, str, bool]:
        """`child` run to its end: its exit status, its line holding `word`, whether it printed no traceback."""
        status = child.wait(PROCESS_SECONDS)
        said = next((line for line in child.lines if word in line), "")
        return status, said, not any("Traceback" in line for line in child.lines)


@contextmanager
def target_federation(root: Path, *, privacy: bool) -> Iterator[TargetFederation]:
    names = (*THREE[:2], TARGET)
    plan = process_federation_plan(1000, 2)
    if privacy:  # a DP collaborator joins only a plan that declares every institution's size
        sources = {name: {"dataset": "adult", "partition": "race", "index": index} for index, name in enumerate(names)}
        plan["influence"] = {"weights": "declared", "sizes": declared_sizes(sources, 0) or {}}
    workspace = make_workspace(root, names, plan=plan)
    if privacy:
        config = workspace.configs[TARGET]
        config.write_text(config.read_text() + "\n[privacy]\nenabled = true\n")
    federation = TargetFederation(workspace)
    aggregator = start_aggregator(workspace, sink=federation.log)
    group = HonestCollaborators.start(workspace, names[:2], real)
    try:
        yield federation
    finally:
        for child in federation.children:
            child.kill()
        group.stop()
        aggregator.kill()


def lost_record_row(root: Path, book: RowBook) -> None:
    with book.row(
        f"lost record: {TARGET} contributed two rounds, its {TARGET}.{FEDERATION_ID}.bindings.json is deleted and it "
        "restarts (a real `fedfair collaborator start`) while the aggregator process is past round 1",
        "exit status 2 with local-state-lost, no traceback; started with --reset-state it joins and trains (the control)",
        "real aggregator and collaborator processes",
    ) as row:
        with target_federation(root, privacy=False) as federation:
            first = federation.start()
            contributed = federation.trained(2)
            first.kill()
            bindings_path(federation.workspace, TARGET).unlink(missing_ok=True)
            status, said, clean = federation.refused(federation.start(), "local-state-lost")
            reset = federation.start("--reset-state")
            rejoined = federation.trained(1)
            running = reset.process.poll() is None
        row.record(
            f"{TARGET} trained two rounds: {contributed}; restarted without its record: exit status {status}, "
            f"{said[:240] or 'no local-state-lost line'!r}; with --reset-state: trained again {rejoined}, still "
            f"running {running}",
            contributed and status == 2 and bool(said) and clean and rejoined and running,
            exit_status=status,
        )


def lost_ledger_row(root: Path, book: RowBook) -> None:
    with book.row(
        f"lost ledger: {TARGET} ([privacy] on) trained two rounds, its privacy accountant "
        f"({TARGET}.DATA.privacy.json) is deleted, its record kept, and it restarts (a real process)",
        "exit status 2 naming the accountant that charged fewer rounds than the record counts, no traceback; with "
        "the accountant restored from its backup it joins and trains again (the control)",
        "real aggregator and collaborator processes",
    ) as row:
        with target_federation(root, privacy=True) as federation:
            config = load_collaborator_config(federation.workspace.configs[TARGET])
            accountant = privacy_state_path(ledger_folder(), TARGET, data_identity(config.data))
            first = federation.start()
            contributed = federation.trained(2)
            first.kill()
            backup = accountant.read_bytes() if accountant.exists() else None
            accountant.unlink(missing_ok=True)
            status, said, clean = federation.refused(federation.start(), "privacy accountant")
            count = trainings(federation.workspace, TARGET) or 0
            if backup is not None:
                accountant.write_bytes(backup)
            restored = federation.start()
            rejoined = federation.trained(count + 1)
            running = restored.process.poll() is None
        row.record(
            f"{TARGET} trained two private rounds: {contributed} (accountant backed up: {backup is not None}); "
            f"restarted without its accountant: exit status {status}, {said[:300] or 'no line naming it'!r}; "
            f"accountant restored: trained again {rejoined}, still running {running}",
            contributed and backup is not None and status == 2 and bool(said) and clean and rejoined and running,
            exit_status=status,
        )
