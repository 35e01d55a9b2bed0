"""Waits with an end, laggards named and bounded, quiet reconnects, odd values as named errors (issue 46, 5-7).

Each row runs against real processes on loopback:

- a silent aggregator: the real ``fedfair aggregator start`` waiting for a quorum that never comes, and a
  ``fedfair collaborator start`` process with ``[collaborator] idle_timeout_seconds``: it must exit with
  status 2 and ``aggregator-silent`` once the stated time passed, never wait on;
- a late site: the real aggregator process with ``[quorum] grace_factor``; two honest collaborators and one
  that answers every stage LATE seconds after its task (fedfair's own collaborator with its upload
  delayed), in threads: every stage it missed must end at the grace (k x the median answer, at least the
  floor), the site named in every round's ``held_up_by``; the full run adds the same federation without a
  grace, for the ratio of round times;
- 500 reconnects: a listed collaborator's certificate opening and cancelling its task stream in a loop
  (the hostile client): the aggregator's log and events may grow by a few lines, not two per reconnect;
- odd values: a 400-digit integer in the served plan (a patched aggregator), ``steps`` of 10**30 and a
  100,000-deep JSON as a collaborator's privacy state, ``latest: 1e999`` in its record, and a flipped byte
  in the aggregator's checkpoint: each process must exit with status 2 and a message naming the file
  or field, never a traceback.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attacks.hostile_client import WIRE_VERSION, Credentials, join_binding, open_channel, stub
from attacks.rows import PATCHED_AGGREGATOR, PATCHED_COLLABORATOR, PURE, RowBook
from fedfair.privacy.accounting import STATE_FORMAT, STATE_VERSION
from fedfair.runtime.local.processes import Child, aggregator_command, child_environment, collaborator_command
from fedfair.runtime.local.processes import start_aggregator
from fedfair.runtime.aggregator import network as network_module
from fedfair.runtime.output_folder import CHECKPOINT_NAME
from fedfair.runtime.aggregator.checkpoint import read_round_log, save_checkpoint
from fedfair.runtime.aggregator.limits import PRESENCE_BURST
from fedfair.runtime.aggregator.network import serve
from fedfair.runtime.aggregator.stages import GRACE_FLOOR_SECONDS
from fedfair.runtime.aggregator.start import prepare
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.input_record import FORMAT as RECORD_FORMAT
from fedfair.runtime.peer.retries import RetryPolicy
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, plan_digest
from fedfair.runtime.transport import pb

NAMES = ["site-a", "site-b", "site-c"]
FEDERATION_ID = "fedfair-launch"
IDLE_SECONDS = 5.0
"""[collaborator] idle_timeout_seconds of the silent-aggregator row."""
LATE_SECONDS = 4.0
"""How late the late site answers every stage."""
GRACE = 2.0
"""[quorum] grace_factor of the late-site row."""
RECONNECTS = 500
QUICK_RECONNECTS = 100
"""The quick run's reconnects: still 25 times the lines a throttled log may add."""
PROCESS_SECONDS = 120.0
"""Longest a process of these rows may take to start and stop (the machine may be loaded)."""
QUICK_RETRY = RetryPolicy(max_wait_seconds=120.0, base_seconds=0.2, cap_seconds=1.0)


def waits_rows(where: Path, book: RowBook, *, quick: bool) -> None:
    """Every row of this module (see its notes). `quick` (the test suite's run) keeps the silent aggregator
    and 100 reconnects, about 15 s on 2 cores; the late site (about 2.5 min with its run without a grace) and
    the odd values (about 1.5 min of process starts) run in the full matrix, and each has its tests in
    tests/runtime (test_laggard.py, test_checkpoint.py), tests/core (test_tables.py, test_files.py)."""
    workspace = make_workspace(where / "waiting", NAMES, plan={"quorum": {"min_collaborators": 3}})
    log = io.StringIO()
    # One aggregator waiting for a quorum of three that never comes: silent to the collaborator, then
    # the target of the reconnects.
    aggregator = start_aggregator(workspace, sink=log)
    try:
        silent_aggregator_row(workspace, log, book)
        reconnect_row(workspace, aggregator, book, QUICK_RECONNECTS if quick else RECONNECTS)
    finally:
        aggregator.kill()
    if not quick:
        late_site_rows(where / "late", book)
        odd_value_rows(where / "odd", book)


def _set_key(path: Path, section: str, line: str) -> None:
    """Add `line` at the top of `section` of the TOML file `path`."""
    path.write_text(path.read_text().replace(f"[{section}]\n", f"[{section}]\n{line}\n", 1))


def _run_to_exit(workspace: Workspace, name: str, log: io.StringIO) -> tuple[int, str, float]:
    """Run `name`'s collaborator process to its end: exit status, its output, wall seconds."""
    started = time.monotonic()
    child = Child(name, collaborator_command(workspace, name), env=child_environment(None), sink=log)
    try:
        status = child.wait(PROCESS_SECONDS)
    finally:
        child.kill()
    return status, "\n".join(child.lines), time.monotonic() - started


# ---------------------------------------------------------------- waits with an end


def silent_aggregator_row(workspace: Workspace, log: io.StringIO, book: RowBook) -> None:
    with book.row(
        f"a silent aggregator (serves, never sends a task), [collaborator] idle_timeout_seconds = {IDLE_SECONDS:g}",
        "the collaborator process exits with status 2 and aggregator-silent once the stated time passed without "
        "a task, saying it waits meanwhile; no traceback",
        PURE,
    ) as row:
        _set_key(workspace.configs["site-a"], "collaborator", f"idle_timeout_seconds = {IDLE_SECONDS}")
        status, output, seconds = _run_to_exit(workspace, "site-a", log)
        said = next((line for line in output.splitlines() if "aggregator-silent:" in line), "")
        stated = float(said.split("no progress for ")[1].split(" s")[0]) if "no progress for " in said else None
        ok = status == 2 and stated is not None and IDLE_SECONDS <= stated < IDLE_SECONDS + 1.0
        row.record(
            f"exit status {status} after {seconds:.1f} s of process (start-up, join, then the wait); "
            f"its message: {said[:200] or 'none'}",
            ok and "Traceback" not in output,
            exit_status=status,
            stated_wait_seconds=stated,
            process_seconds=round(seconds, 1),
        )


# ---------------------------------------------------------------- a late site


def _late(collaborator: Collaborator, seconds: float) -> None:
    """Delay each upload of `collaborator` by `seconds`: an insider answering just before a deadline."""
    submit = collaborator.submit

    def late(stub_: Any, binding: pb.Binding, payload: bytes) -> None:
        time.sleep(seconds)
        submit(stub_, binding, payload)

    collaborator.submit = late  # type: ignore[method-assign]


@contextmanager
def _threads(workspace: Workspace, late: str, seconds: float) -> Iterator[dict[str, Collaborator]]:
    """Every collaborator of `workspace` in a thread, `late` delayed by `seconds`; stopped on exit."""
    collaborators = {
        name: Collaborator(load_collaborator_config(path), retry=QUICK_RETRY)
        for name, path in workspace.configs.items()
    }
    _late(collaborators[late], seconds)
    threads = [threading.Thread(target=c.run, daemon=True, name=f"waits-{n}") for n, c in collaborators.items()]
    for thread in threads:
        thread.start()
    try:
        yield collaborators
    finally:
        for collaborator in collaborators.values():
            collaborator.stop()
        for thread in threads:
            thread.join(30)


def late_federation(
    where: Path, grace: float | None, rounds: int, late: float = LATE_SECONDS
) -> tuple[list[dict[str, Any]], float]:
    """A federation of the real aggregator process and NAMES in threads, site-c `late` seconds late in every
    stage (0: an honest site-c): its round log, seconds."""
    quorum: dict[str, Any] = {"min_collaborators": 2, "round_timeout_seconds": 30.0}
    if grace is not None:
        quorum["grace_factor"] = grace
    plan = {"training": {"rounds": rounds}, "quorum": quorum, "evaluation": {"every": 0}}
    workspace = make_workspace(where, NAMES, plan=plan)
    log = io.StringIO()
    started = time.monotonic()
    aggregator = start_aggregator(workspace, sink=log)
    try:
        with _threads(workspace, "site-c", late):
            status = aggregator.wait(PROCESS_SECONDS + 40.0 * rounds)
    finally:
        aggregator.kill()
    if status != 0:
        raise RuntimeError(f"the aggregator exited with {status}: {log.getvalue()[-2000:]}")
    return [record for record in read_round_log(workspace.output) if record["round"] >= 1], time.monotonic() - started


def _grace_bound(answers: dict[str, float | None]) -> float:
    """Where the grace ends a stage with these answer times (None: no answer): max(k x median, floor)."""
    times = sorted(seconds if seconds is not None else float("inf") for seconds in answers.values())
    return max(GRACE * times[(len(times) + 1) // 2 - 1], GRACE_FLOOR_SECONDS)


def late_site_rows(where: Path, book: RowBook) -> None:
    rounds = 3
    with book.row(
        f"a late site: one of 3 answers every stage {LATE_SECONDS:g} s late, [quorum] grace_factor = {GRACE:g}",
        "every stage it missed ends at the grace (k x its median answer, at least the floor), the site is dropped "
        "from the round and named in every round's held_up_by; the rounds apply without it",
        PATCHED_COLLABORATOR,
    ) as row:
        log, seconds = late_federation(where / "grace", GRACE, rounds)
        overruns: list[float] = []
        for record in log:
            for stage, answers in record["answer_seconds"].items():
                if answers.get("site-c") is None and stage in record.get("stage_seconds", {}):
                    overruns.append(record["stage_seconds"][stage] - _grace_bound(answers))
        named = [sorted(record.get("held_up_by", {})) for record in log]
        round_seconds = [round(record["seconds"], 2) for record in log]
        ok = (
            all(record["status"] == "applied" and record["contributors"] == NAMES[:2] for record in log)
            and all(names == ["site-c"] for names in named)
            and bool(overruns)
            and max(overruns) < 1.0
        )
        details: dict[str, Any] = {"round_seconds": round_seconds, "held_up_by": [r["held_up_by"] for r in log]}
        observed = (
            f"{len(log)} rounds applied by {log[0]['contributors'] if log else []}; held up by {named}; round seconds "
            f"{round_seconds}; stages past the grace bound by at most {max(overruns, default=float('nan')):.2f} s"
        )
        plain, plain_seconds = late_federation(where / "no-grace", None, rounds)
        slow = [round(record["seconds"], 2) for record in plain]
        details.update(
            round_seconds_without_grace=slow, federation_seconds=[round(seconds, 1), round(plain_seconds, 1)]
        )
        observed += f"; without a grace the same rounds took {slow} s"
        row.record(observed, ok, **details)


# ---------------------------------------------------------------- reconnects


def _presence_lines(workspace: Workspace, aggregator: Child, name: str) -> int:
    """Connect and disconnect lines of the aggregator's log (its log file, else its console) and events
    that name `name`."""
    log_file = workspace.output / "aggregator.log"
    logged = log_file.read_text().splitlines() if log_file.exists() else aggregator.lines
    said = re.compile(rf"\b{re.escape(name)} (connected|reconnected|disconnected)\b")
    events = [json.loads(line) for line in (workspace.output / "events.jsonl").read_text().splitlines()]
    lines = sum(bool(said.search(line)) for line in logged)
    return lines + sum(event["event"] in ("connect", "disconnect") and event.get("name") == name for event in events)


def reconnect_row(workspace: Workspace, aggregator: Child, book: RowBook, reconnects: int) -> None:
    with book.row(
        f"{reconnects} reconnects of a listed collaborator (task stream opened and cancelled in a loop)",
        f"the aggregator's log and events grow by at most {PRESENCE_BURST} lines each, not two per reconnect",
        PURE,
    ) as row:
        files = (workspace.certs / "ca.crt", workspace.certs / "site-b.crt", workspace.certs / "site-b.key")
        channel = open_channel(workspace.address, Credentials(*files))
        try:
            federation = stub(channel)
            request = pb.TaskRequest(after=join_binding(FEDERATION_ID))
            federation.GetPlan(
                pb.PlanRequest(binding=join_binding(FEDERATION_ID), wire_version=WIRE_VERSION), timeout=10.0
            )
            time.sleep(1.0)
            before = _presence_lines(workspace, aggregator, "site-b")
            started = time.monotonic()
            for _ in range(reconnects):
                call = federation.WaitForTasks(request)
                time.sleep(0.02)  # long enough for the aggregator to count the stream before it ends
                call.cancel()
            flood = time.monotonic() - started
            time.sleep(2.0)
            added = _presence_lines(workspace, aggregator, "site-b") - before
        finally:
            channel.close()
        row.record(
            f"{reconnects} reconnects in {flood:.1f} s added {added} connect and disconnect lines to the "
            "aggregator's log and events",
            added <= 2 * PRESENCE_BURST,
            lines_added=added,
            reconnect_seconds=round(flood, 1),
        )


# ---------------------------------------------------------------- odd values


@contextmanager
def served(workspace: Workspace, settings: Callable[[bytes], bytes] | None = None) -> Iterator[None]:
    """The aggregator's gRPC service for `workspace` (no rounds), its served plan rewritten by `settings`."""
    plan = load_aggregator_plan(workspace.plan)
    original = network_module.shared_settings
    if settings is not None:
        network_module.shared_settings = lambda plan_: settings(original(plan_))  # type: ignore[assignment]
    try:
        network = serve(plan, plan_digest(plan))
    finally:
        network_module.shared_settings = original  # type: ignore[assignment]
    try:
        yield
    finally:
        network.stop()


def _huge_timeout(settings: bytes) -> bytes:
    document = json.loads(settings)
    document["quorum"]["round_timeout_seconds"] = 10**399
    return json.dumps(document).encode()


def _odd_row(book: RowBook, attack: str, named: str, method: str, run: Callable[[], tuple[int, str]]) -> None:
    with book.row(attack, f"exit status 2 and one message naming {named}; no traceback", method) as row:
        status, output = run()
        said = next((line for line in output.splitlines() if named in line), "")
        row.record(
            f"exit status {status}; {said[:240] or 'no line naming ' + named}",
            status == 2 and bool(said) and "Traceback" not in output,
            exit_status=status,
        )


def odd_value_rows(where: Path, book: RowBook) -> None:
    # Noised answers: site-a's own [privacy] below refuses a secure plan whose answers decode exact.
    workspace = make_workspace(where, NAMES, plan={"privacy": {"report_epsilon": 1.0}})
    log = io.StringIO()
    config = workspace.configs["site-a"]

    def collaborator() -> tuple[int, str]:
        status, output, _ = _run_to_exit(workspace, "site-a", log)
        return status, output

    def against_served(rewrite: Callable[[bytes], bytes] | None) -> Callable[[], tuple[int, str]]:
        def run() -> tuple[int, str]:
            with served(workspace, rewrite):
                return collaborator()

        return run

    def state(suffix: str, text: str) -> Callable[[], tuple[int, str]]:
        path = config.parent / f"site-a.{FEDERATION_ID}.{suffix}"

        def run() -> tuple[int, str]:
            path.write_text(text)
            try:
                return against_served(None)()
            finally:
                path.unlink()

        return run

    _odd_row(
        book,
        "a 400-digit integer in the served plan ([quorum] round_timeout_seconds)",
        "[quorum] round_timeout_seconds",
        PATCHED_AGGREGATOR,
        against_served(_huge_timeout),
    )
    config.write_text(config.read_text() + "\n[privacy]\nenabled = true\n")
    privacy = {"format": STATE_FORMAT, "version": STATE_VERSION, "federation": FEDERATION_ID, "rounds": 1}
    steps = json.dumps({**privacy, "history": [[1.0, 0.01, 10**30]]})
    _odd_row(book, "steps = 10**30 in a privacy state file", "history[0][2]", PURE, state("privacy.json", steps))
    deep = "[" * 100_000 + "]" * 100_000
    _odd_row(
        book, "a 100,000-deep JSON as a privacy state file", "nested 100000 levels", PURE, state("privacy.json", deep)
    )
    record = json.dumps({"format": RECORD_FORMAT, "latest": 0, "inputs": {}}).replace("0,", "1e999,")
    _odd_row(book, "latest = 1e999 in a collaborator's record", "latest = 1e999", PURE, state("bindings.json", record))

    def flipped_checkpoint() -> tuple[int, str]:
        plan = load_aggregator_plan(workspace.plan)
        checkpoint = prepare(plan, resume=False)
        assert checkpoint is not None
        path = save_checkpoint(plan.aggregator.output, checkpoint)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        command = [*aggregator_command(workspace), "--resume"]
        aggregator = Child("aggregator", command, env=child_environment(None), sink=log)
        try:
            return aggregator.wait(PROCESS_SECONDS), "\n".join(aggregator.lines)
        finally:
            aggregator.kill()

    _odd_row(
        book,
        f"one flipped bit in the aggregator's {CHECKPOINT_NAME}",
        "does not match its own SHA-256 digest",
        PURE,
        flipped_checkpoint,
    )
