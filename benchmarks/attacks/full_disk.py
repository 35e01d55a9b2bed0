"""A full disk under a collaborator (issue 65): its workspace fills while the federation runs, every party a process.

A pinned three-site secure federation of 6 rounds, each needing all three sites, over loopback mutual TLS. site-c's
folder (its config, log, records and final bundle) is a 2 MiB tmpfs, filled to its last byte from outside once
round 2 is logged. Rows:

- full disk: site-c exits 2 with one line naming the full disk, the file and the fix, no traceback anywhere; its
  records read back whole (no temporary file left, rounds 1 and 2 held);
- restarted with room: the filler removed, the same command rejoins, finishes, and counts rounds 1 and 2 from its
  record; the others wait for it (the plan needs all three), all exiting as the round log says (0, or 3 if one aborted).

A tmpfs needs root, or ``unshare --user --map-root-user --mount`` before the command; else both rows are skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from attacks.federation import plan_sections
from attacks.ledger import PROCESSES, Quiet
from attacks.rows import Row, RowBook
from fedfair.core.errors import DISK_FULL, ConfigError
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.input_record import InputRecord
from fedfair.runtime.collaborator.outcome import OUTCOME_SUFFIX, OutcomeRecord
from fedfair.runtime.local.processes import Child, start_aggregator, start_collaborator
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

THREE = ("site-a", "site-b", "site-c")
FULL = "site-c"
ROUNDS, FILL_AFTER = 6, 2
DISK_BYTES = 2 << 20
"""The tmpfs under site-c: several times what it keeps over a whole run (about 300 KiB), so only the filler fills it."""
FILLER = "filler"
WAIT_SECONDS = 240.0
SITE_ROW = (
    "full disk: site-c's workspace (a 2 MiB tmpfs) filled to its last byte from outside after round 2, the process "
    "running",
    "site-c exits 2 with one line naming the full disk, the file it was writing and the fix; no traceback in any "
    "process's output; its records read back whole (no temporary file left, rounds 1 and 2 held)",
)
RESTART_ROW = (
    "full disk, restarted with room: the filler removed and site-c's same command run again while the federation "
    "waits for it",
    f"site-c rejoins and takes part in every round after its return, its closing count including the rounds before "
    f"the disk filled; the federation reaches round {ROUNDS}, and every process exits as the round log says (0 when "
    "every round applied, 3 when one aborted)",
)


def full_disk_rows(where: Path, book: RowBook) -> None:
    """Both rows of this module on one federation (see the module's notes)."""
    with small_disk(where / FULL, DISK_BYTES) as unmountable:
        if unmountable is not None:
            for attack, expected in (SITE_ROW, RESTART_ROW):
                book.skip(attack, expected, PROCESSES, unmountable)
            return
        _run(where, book)


def _run(where: Path, book: RowBook) -> None:
    sections = plan_sections(secure=True, rounds=ROUNDS, quorum=len(THREE), timeout=60.0)
    workspace = make_workspace(where, THREE, plan=sections, manifest=True)
    plan = load_aggregator_plan(workspace.plan)
    site = where / FULL
    started = time.perf_counter()
    aggregator = start_aggregator(workspace, sink=Quiet())
    children = {name: start_collaborator(workspace, name, sink=Quiet()) for name in THREE}
    processes: dict[str, Child] = {"aggregator": aggregator, **children}
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while len(read_round_log(plan.aggregator.output)) < FILL_AFTER and time.monotonic() < deadline:
            time.sleep(0.05)
        filled = fill(site / FILLER)
        full_status = children[FULL].wait(WAIT_SECONDS)
        stopped = time.perf_counter()
        state = kept_state(site, plan.federation_id)
        (site / FILLER).unlink()
        processes[f"{FULL} (restarted)"] = start_collaborator(workspace, FULL, sink=Quiet())
        status = {label: child.wait(WAIT_SECONDS) for label, child in processes.items() if label != FULL}
        ended = time.perf_counter()
    finally:
        for child in processes.values():
            child.kill()
        shutil.copytree(site, where / f"{FULL} (kept)", dirs_exist_ok=True)  # the tmpfs goes: --keep keeps these
    tracebacks = [label for label, child in processes.items() if any(_traceback(line) for line in child.lines)]
    with book.row(*SITE_ROW, PROCESSES) as row:
        _site_row(row, processes[FULL], full_status, state, tracebacks, site)
        row.details["filler_bytes"] = filled
        row.seconds = stopped - started  # the federation up to site-c's exit (the row's own checks add to it)
    with book.row(*RESTART_ROW, PROCESSES) as row:
        _restart_row(row, read_round_log(plan.aggregator.output), status, processes)
        row.seconds = ended - stopped


def _site_row(row: Row, child: Child, status: int, state: KeptState, tracebacks: list[str], site: Path) -> None:
    said = [line for line in child.lines if line.startswith("fedfair: error:")]
    named = (
        len(said) == 1
        and said[0].startswith(f"fedfair: error: the disk is full writing {site}/")
        and "free space there, then run the same command again" in said[0]
    )
    intact = state.temporary_files == [] and state.bindings == "read back" and state.rounds_held >= FILL_AFTER
    row.record(
        f"site-c exited {status}: {said[0] if said else 'no error line'}; "
        f"{f'tracebacks from {tracebacks}' if tracebacks else 'no traceback from any process'}; "
        f"after its exit: {state.temporary_files or 'no'} temporary files, bindings {state.bindings}, "
        f"{state.rounds_held} rounds held by its outcome record",
        status == 2 and named and not tracebacks and intact,
        state=asdict(state),
    )


def _restart_row(
    row: Row, records: list[dict[str, object]], status: dict[str, int], processes: dict[str, Child]
) -> None:
    rounds = [(int(str(record["round"])), str(record["status"])) for record in records]
    without = [number for (number, _), record in zip(rounds, records) if FULL not in _names(record.get("contributors"))]
    aborted = {str(record["round"]): str(record.get("reason")) for record in records if record["status"] == "aborted"}
    returned = max(without, default=0)
    after = [number for number, outcome in rounds if number > returned and outcome == "applied"]
    complete = all(outcome == "applied" for _, outcome in rounds)
    expected = 0 if complete else 3
    rejoined = any("site-c reconnected" in line for line in processes["aggregator"].lines)
    # Its count spans the restart only if the record written before the disk filled was read back.
    held = sum(outcome == "applied" and number not in without for number, outcome in rounds)
    counted = f"update in {held} of {ROUNDS} rounds" in _closing(processes[f"{FULL} (restarted)"])
    row.record(
        f"rounds {[f'{number} {outcome}' for number, outcome in rounds]}; site-c missing from rounds {without}, "
        f"contributing to rounds {after} after its return ({'reconnected' if rejoined else 'no reconnection seen'}); "
        f"aborted: {aborted or 'none'}; the restarted site-c {'counts' if counted else 'does not count'} {held} of "
        f"{ROUNDS} rounds from its record; exit statuses {status}",
        rejoined
        and counted
        and len(rounds) == ROUNDS
        and rounds[-1][0] == ROUNDS
        and bool(after)
        and after == list(range(returned + 1, ROUNDS + 1))
        and set(status.values()) == {expected},
        exit_statuses=status,
        rounds_without_site_c=without,
        aborted=aborted,
        closing_lines={label: _closing(processes[label]) for label in status},
    )


def _closing(child: Child) -> str:
    """A process's last line but its progress bar's: what it says it did (a process's closing line comes last)."""
    said = [line for line in child.lines if not line.startswith(f"{child.label}: ")]
    return said[-1] if said else ""


def _names(value: object) -> list[str]:
    return [str(name) for name in value] if isinstance(value, list) else []


def _traceback(line: str) -> bool:
    return "Traceback (most recent call last)" in line or "--- Logging error ---" in line


@contextmanager
def small_disk(folder: Path, size: int) -> Iterator[str | None]:
    """A tmpfs of `size` bytes on `folder` for the block: yields None, or why none could be mounted there."""
    folder.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        yield "no `mount` command on this machine"
        return
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        yield (
            "cannot mount a tmpfs here (it needs root, or this command under `unshare --user --map-root-user "
            f"--mount`): {said[0] if said else f'exit {done.returncode}'}"
        )
        return
    try:
        yield None
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], capture_output=True, check=False)


def fill(path: Path) -> int:
    """Write zeros to `path` until its disk refuses; the bytes written."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    written = 0
    try:
        while True:
            written += os.write(descriptor, bytes(4096))
    except OSError as error:
        if error.errno not in DISK_FULL:
            raise
    finally:
        os.close(descriptor)
    return written


@dataclass(frozen=True)
class KeptState:
    """What site-c's folder holds after its process ended, read back with the collaborator's own readers."""

    temporary_files: list[str]
    bindings: str
    """"read back", or the reader's refusal."""
    rounds_held: int
    """The training rounds its outcome record holds (an unreadable record is set aside and holds none)."""


def kept_state(site: Path, federation: str) -> KeptState:
    """Read site-c's records back as a restart would (see :class:`KeptState`)."""
    try:
        InputRecord(site / f"{FULL}.{federation}.bindings.json", federation)
        bindings = "read back"
    except ConfigError as error:
        bindings = f"refused: {error}"
    return KeptState(
        sorted(path.name for path in site.iterdir() if path.name.startswith(".")),
        bindings,
        OutcomeRecord(site / f"{FULL}.{federation}.{OUTCOME_SUFFIX}", 1).contributed,
    )
