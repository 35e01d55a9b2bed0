"""fedfair's own runtime beside the Flower integration: one federation, run both ways, interleaved.

The task is the Flower example's (examples/flower-fedsrcvar/: its MLP, Adult split by race into 3 sites, the
strategy's defaults but rho = 0.2): fedfair's aggregator and three collaborator processes over mutual TLS, the plan
naming the example's model factory (`fedsrcvar_app.task:model`); and `flwr run` of the example through one of
Flower's engines (`--engine`): the deployment engine, a SuperLink serving TLS with a certificate of fedfair's PKI
and three SuperNodes, or the simulation engine, a simulating SuperLink whose Ray backend runs three virtual
SuperNodes' ClientApps in its worker processes (one actor of one CPU a core). Both systems take
b_k = round(fraction * n_k) (the plan's batch_fraction; the example's batch-fraction), the same seed and rounds.
fedfair runs with plain sums (`--secure` masks them: its sums are then fixed point, so equality is to its
quantisation), no server momentum and no bound on a site's update (`UNBOUNDED_NORM`): Algorithm 1, as Flower's plain
strategy runs it.

Per party (the aggregator or the SuperLink with the ServerApp it starts; each site's collaborator or SuperNode
with the ClientApp processes it starts) it reads the CPU seconds of the party's whole process tree: each party
runs under a subreaper that reaps every descendant and reports getrusage(RUSAGE_CHILDREN). A simulation is one
party, the SuperLink's tree (the ServerApp's process, Ray's daemons and workers): its CPU is split by sampling
/proc into Ray's worker processes, where the sites' ClientApps run, and the rest. The `flwr run` command itself
is the operator's, not a party's, and is not counted. Bytes on the wire are what the sites and the server
exchange: every site dials the server through a relay in this process that counts each direction's bytes (TLS
records, headers included); a simulation sends none over a network. Final model equality: the largest relative
difference of the suffix-averaged theta, and of c, between the two runs.

With several round counts (`--rounds 2 8`) each repeat runs each count, and the document fits each system's wall
and CPU as start-up plus a cost per round (least squares over the runs) and projects them to `--project` rounds
(200, the issue's federation): the deployment engine's ClientApp process per message makes its rounds too slow on
this machine to run 200 of them. The simulation engine's are not, and it runs the 200 itself:

    nice -n 3 .venv/bin/python benchmarks/flower_bench.py --rounds 2 8 --repeats 1 \
        --json benchmarks/results/flower_bench.json
    nice -n 3 .venv/bin/python benchmarks/flower_bench.py --engine simulation --rounds 200 --repeats 2 \
        --json benchmarks/results/flower_bench_simulation.json

Needs `make test-flower`'s environment (.venv-flower) for Flower's commands; one repeat of each system after the
other. Nice it lightly, not by nice's default 10: a SuperNode's ClientApp process must send its first heartbeat
within 30 s of being claimed, which a process at nice 10 on a host loaded far past its cores misses (docs/flower.md).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from published import publish
from fedfair import pki
from fedfair.runtime.local.workspace import Workspace, free_port, listening, make_workspace, site_names, toml_text
from fedfair.runtime.output_folder import FINAL_MODEL_NAME

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "flower-fedsrcvar"
FACTORY = "fedsrcvar_app.task:model"
SITES = 3
UNBOUNDED_NORM = 100.0
"""fedfair's [influence] update_norm here: no update of this federation comes near it (the longest is 0.29)."""
PR_SET_CHILD_SUBREAPER = 36
"""prctl's option that makes a process the reaper of its orphaned descendants (linux/prctl.h)."""


def party(report: Path, command: list[str]) -> int:
    """Run `command` as a party: reap its every descendant, then write their CPU seconds to `report`.

    The total is getrusage's, exact, plus what the kernel drops: a process whose parent ignores SIGCHLD (as Ray's
    raylet does, for its workers) is reaped without adding its CPU to anyone's, so that part is sampled from
    /proc while it lives, each process to within a sampling period. The report also gives the CPU of Ray's
    ClientApp actor processes (where Flower's simulation engine runs the sites' ClientApps), sampled alike.
    SIGTERM ends the party's whole process tree (a Flower server runs until told to stop).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    child = subprocess.Popen(command)
    seen: dict[tuple[int, int], Sampled] = {}
    while child.poll() is None and not stopped.is_set():
        for pid in descendants():
            if (sampled := sample(pid)) is not None:
                key = (pid, sampled.started)
                seen[key] = sampled.joined(seen.get(key))
        time.sleep(0.5)
    # Orphans of the party's tree are this process's children now (a subreaper's): end and reap them, as long as
    # any is left (a child may start another before it dies).
    reaped = set()
    while children := own_children():
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _ in children:
            reaped.add(os.waitpid(-1, 0)[0])
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    # An orphan of a parent that ignored SIGCHLD became this process's child, and getrusage counted it.
    dropped = sum(each.cpu_seconds for (pid, _), each in seen.items() if each.parent_drops_it and pid not in reaped)
    report.write_text(
        json.dumps(
            {
                "cpu_seconds": usage.ru_utime + usage.ru_stime + dropped,
                "dropped_by_kernel_cpu_seconds": dropped,
                "client_app_actor_cpu_seconds": sum(each.cpu_seconds for each in seen.values() if each.client_app),
                "exit": child.returncode,
            }
        )
    )
    return 0


def own_children() -> list[int]:
    """This process's live children (Linux lists each thread's in /proc)."""
    return [int(pid) for task in Path("/proc/self/task").iterdir() for pid in (task / "children").read_text().split()]


def descendants() -> list[int]:
    """Every live process below this one."""
    found, stack = [], [Path("/proc/self")]
    while stack:
        for task in stack.pop().glob("task/*"):
            try:
                children = [int(pid) for pid in (task / "children").read_text().split()]
            except OSError:  # the task ended while we looked
                continue
            found += children
            stack += [Path(f"/proc/{pid}") for pid in children]
    return found


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SIGCHLD_BIT = 1 << (signal.SIGCHLD - 1)
"""SIGCHLD's bit in /proc/PID/status's SigIgn mask."""


@dataclass(frozen=True)
class Sampled:
    """One process as /proc last showed it."""

    started: int
    """Its start time in clock ticks: with the pid, it names the process (pids are reused)."""
    cpu_seconds: float
    """Its own CPU and that of the children it reaped."""
    parent_drops_it: bool
    """Its parent ignores SIGCHLD: the kernel reaps it and adds its CPU to no one's."""
    client_app: bool
    """It is (or was) a Ray actor running Flower ClientApps."""

    def joined(self, earlier: Sampled | None) -> Sampled:
        """This sample, still a ClientApp actor if it was one (an actor's title changes as it works)."""
        if earlier is None or not earlier.client_app:
            return self
        return Sampled(self.started, self.cpu_seconds, self.parent_drops_it, True)


def sample(pid: int) -> Sampled | None:
    """The process `pid` as /proc shows it now; None if it has ended."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        # stat's fields after the name: state is the first, ppid the 2nd; utime, stime, cutime, cstime the 12th
        # to 15th; starttime the 20th.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        parent = Path(f"/proc/{fields[1]}/status").read_text()
    except OSError:
        return None
    ignored = next(int(line.split()[1], 16) for line in parent.splitlines() if line.startswith("SigIgn:"))
    return Sampled(
        started=int(fields[19]),
        cpu_seconds=sum(int(ticks) for ticks in fields[11:15]) / CLOCK_TICKS,
        parent_drops_it=bool(ignored & SIGCHLD_BIT),
        client_app=title.startswith(b"ray::ClientAppActor"),
    )


@dataclass
class Relay:
    """A TCP relay from a port of its own to `target`, counting the bytes each way (a thread of this process)."""

    target: tuple[str, int]
    port: int = field(default_factory=free_port)
    up: int = 0
    down: int = 0

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """host:port to dial instead of the target."""
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        peers: dict[socket.socket, tuple[socket.socket, bool]] = {}
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    inbound, _ = self._listener.accept()
                    outbound = socket.create_connection(self.target)
                    peers[inbound], peers[outbound] = (outbound, True), (inbound, False)
                    for end in (inbound, outbound):
                        self._selector.register(end, selectors.EVENT_READ)
                    continue
                other, from_site = peers[sock]
                try:
                    data = sock.recv(1 << 16)
                except OSError:
                    data = b""
                if not data:
                    for end in (sock, other):
                        self._selector.unregister(end)
                        peers.pop(end, None)
                        end.close()
                    continue
                other.sendall(data)
                if from_site:
                    self.up += len(data)
                else:
                    self.down += len(data)

    def close(self) -> None:
        """Stop relaying (open connections are dropped)."""
        self._stop.set()
        self._thread.join()
        self._listener.close()


class Parties:
    """The parties of one run, each under `party`'s subreaper, logging to a file."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env = folder, env
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, command: list[str]) -> None:
        log = (self.folder / f"{name}.log").open("wb")
        wrapper = [sys.executable, __file__, "party", str(self.folder / f"{name}.cpu.json"), "--", *command]
        self.started[name] = subprocess.Popen(wrapper, stdout=log, stderr=subprocess.STDOUT, env=self.env)

    def wait(self, names: list[str], seconds: float) -> None:
        for name in names:
            try:
                self.started[name].wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{name} did not finish within {seconds:.0f} s\n{self.logs()}") from None

    def stop(self) -> None:
        for process in self.started.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.started.values():
            process.wait(timeout=60)

    def cpu(self) -> dict[str, dict[str, float]]:
        """Each party's report (`party`): its tree's CPU seconds, and those of Ray's ClientApp actors in it."""
        return {name: json.loads((self.folder / f"{name}.cpu.json").read_text()) for name in self.started}

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text()[-2000:]}" for path in sorted(self.folder.glob("*.log")))


def wait_for_port(port: int, parties: Parties, seconds: float = 120.0) -> None:
    if not listening(port, seconds):
        raise RuntimeError(f"nothing listened on port {port} within {seconds:.0f} s\n{parties.logs()}")


def environment(extra: dict[str, str]) -> dict[str, str]:
    """Each party's: one compute thread (as fedfair launch gives its children), the example importable."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(ROOT)]),
        **extra,
    }


@dataclass(frozen=True)
class Settings:
    """The federation both systems run."""

    rounds: int
    batch_fraction: float
    rho: float = 0.2
    epsilon: float = 0.1
    local_steps: int = 1
    lr: float = 0.1
    seed: int = 0


@dataclass
class Run:
    """One run's measurements: the CPU report of each party (`party`), bytes None where nothing crossed a network."""

    system: str
    wall_seconds: float
    cpu: dict[str, dict[str, float]]
    bytes_up: int | None
    bytes_down: int | None
    theta_average: list[float]
    c_average: float
    rounds: int

    def summary(self) -> dict[str, Any]:
        """Wall, CPU (all parties; the server and each site, or in a simulation Ray's ClientApp actors and the
        rest) and bytes a round."""
        rounds = self.rounds
        total = sum(report["cpu_seconds"] for report in self.cpu.values())
        common = {
            "system": self.system,
            "rounds": rounds,
            "wall_seconds": round(self.wall_seconds, 1),
            "cpu_seconds_total": round(total, 1),
        }
        if self.bytes_up is None or self.bytes_down is None:
            # One process tree: the sites' ClientApps run in Ray's actors, the rest is the SuperLink, the
            # ServerApp and Ray's own daemons.
            client_apps = sum(report["client_app_actor_cpu_seconds"] for report in self.cpu.values())
            return common | {
                "client_app_actor_cpu_seconds": round(client_apps, 1),
                "rest_cpu_seconds": round(total - client_apps, 1),
                "dropped_by_kernel_cpu_seconds": round(
                    sum(report["dropped_by_kernel_cpu_seconds"] for report in self.cpu.values()), 1
                ),
                "bytes_per_round_up": None,
                "bytes_per_round_down": None,
            }
        sites = [report["cpu_seconds"] for name, report in self.cpu.items() if name != "server"]
        return common | {
            "server_cpu_seconds": round(self.cpu["server"]["cpu_seconds"], 1),
            "site_cpu_seconds_median": round(statistics.median(sites), 1),
            "site_cpu_seconds_each": [round(seconds, 1) for seconds in sites],
            "bytes_per_round_up": round(self.bytes_up / rounds),
            "bytes_per_round_down": round(self.bytes_down / rounds),
        }


def fedfair_workspace(settings: Settings, folder: Path, secure: bool) -> Workspace:
    """fedfair's federation of `settings` in `folder`: its plan runs Algorithm 1, as Flower's strategy does, on the
    example's model factory, each site weighted by its declared b_k."""
    names = site_names(SITES)
    plan = {
        "objective": {"epsilon": settings.epsilon, "rho": settings.rho},
        "training": {
            "rounds": settings.rounds,
            "local_steps": settings.local_steps,
            "batch_fraction": settings.batch_fraction,
            "lr": settings.lr,
            "threshold_lr": settings.lr,
            "seed": settings.seed,
            "average_from": 0.5,
            "server_momentum": 0.0,  # a plan's default moves with momentum; Algorithm 1 (and the strategy) does not
        },
        "model": {"factory": FACTORY},
        "secure_aggregation": {"enabled": secure},
        "quorum": {"min_collaborators": SITES},
        "evaluation": {"every": 0},
    }
    workspace = make_workspace(folder / "workspace", names, plan=plan)
    # The plan's default bound C = 2 lr tau on each site's update is the runtime's, not Algorithm 1's: it scales
    # 9 of this federation's 600 site-updates (the first at round 100, as c reaches the losses), which parted
    # the two systems' models by 1.1e-3 after 200 rounds (docs/flower.md). Kept with its declared weights.
    written = tomllib.loads(workspace.plan.read_text())
    written["influence"]["update_norm"] = UNBOUNDED_NORM
    workspace.plan.write_text(toml_text(written))
    return workspace


def run_fedfair(settings: Settings, folder: Path, secure: bool) -> Run:
    """The aggregator and three collaborators, each a process, on `fedfair_workspace`'s federation."""
    names = site_names(SITES)
    workspace = fedfair_workspace(settings, folder, secure)
    host, port = workspace.address.rsplit(":", 1)
    relay = Relay((host, int(port)))
    for path in workspace.configs.values():
        config = tomllib.loads(path.read_text())
        config["collaborator"]["aggregator"] = relay.address
        config["model"] = {"factories": [FACTORY]}
        path.write_text(toml_text(config))
    parties = Parties(folder, environment({}))
    fedfair = [sys.executable, "-m", "fedfair.cli"]
    started = time.monotonic()
    parties.start("server", [*fedfair, "aggregator", "start", "--plan", str(workspace.plan)])
    wait_for_port(int(port), parties)
    for name in names:
        parties.start(name, [*fedfair, "collaborator", "start", "--config", str(workspace.configs[name])])
    try:
        parties.wait(["server", *names], seconds=3600)
    finally:
        wall = time.monotonic() - started
        parties.stop()
        relay.close()
    output = torch.load(workspace.output / FINAL_MODEL_NAME, weights_only=True)
    return Run(
        "fedfair" + (" (secure sums)" if secure else ""),
        wall,
        parties.cpu(),
        relay.up,
        relay.down,
        output["theta_average"].double().tolist(),
        float(output["c_average"]),
        settings.rounds,
    )


def write_tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """fedfair's PKI: a CA, and the SuperLink's certificate (loopback in its names) and key, as PEM files."""
    pki.init_ca(folder)
    certificate = pki.issue(folder, "aggregator", "superlink", hosts=["localhost", "127.0.0.1"])
    return folder / "ca.crt", certificate, folder / "superlink.key"


def flower_environment(folder: Path, flower_bin: Path) -> dict[str, str]:
    """Each Flower party's: `environment`'s, Flower's home in `folder`, no update check or usage report."""
    home = folder / "flwr-home"
    home.mkdir()
    return environment(
        {
            "FLWR_HOME": str(home),
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            "PATH": f"{flower_bin}{os.pathsep}{os.environ['PATH']}",
        }
    )


def flwr_run(
    settings: Settings, flower_bin: Path, parties: Parties, connection: list[str], options: list[str], started: float
) -> tuple[dict[str, Any], float]:
    """`flwr run` of the example against the SuperLink that `connection` (its config lines) names, streamed to
    its end, then every party stopped: the ServerApp's result (the trained pair) and the wall seconds from
    `started` (a monotonic time) to the run's end."""
    env = parties.env
    (Path(env["FLWR_HOME"]) / "config.toml").write_text(
        "\n".join(["[superlink]", 'default = "bench"', "", "[superlink.bench]", *connection]) + "\n"
    )
    result = parties.folder / "flower.json"
    run_config = (
        f"num-server-rounds={settings.rounds} rho={settings.rho} epsilon={settings.epsilon} "
        f"local-steps={settings.local_steps} lr={settings.lr} threshold-lr={settings.lr} seed={settings.seed} "
        f"batch-fraction={settings.batch_fraction} result-file='{result}'"
    )
    try:
        done = subprocess.run(
            [str(flower_bin / "flwr"), "run", str(EXAMPLE), "bench", "--stream", "--run-config", run_config, *options],
            env=env,
            capture_output=True,
            text=True,
            timeout=300 + 120 * settings.rounds,
        )
    finally:
        wall = time.monotonic() - started
        parties.stop()
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(f"flwr run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{parties.logs()}")
    # The strategy leaves a failed site out of its round (as Ray's out-of-memory killer makes its actors fail on a
    # host short of memory) and goes on: that run trained another model, and its costs are not the federation's.
    streamed = (done.stdout + done.stderr).splitlines()  # the ServerApp's log, as `flwr run --stream` shows it
    if dropped := [line for line in streamed if "left round" in line or "no site replied" in line]:
        raise RuntimeError("a site dropped out of the run; free memory and run again:\n" + "\n".join(dropped[:5]))
    return dict(json.loads(result.read_text())), wall


def run_flower(settings: Settings, folder: Path, flower_bin: Path) -> Run:
    """Flower's deployment engine: a SuperLink over TLS, three SuperNodes dialing it, `flwr run` of the example."""
    ca, certificate, key = write_tls_files(folder)
    parties = Parties(folder, flower_environment(folder, flower_bin))
    port = free_port()
    relay = Relay(("127.0.0.1", port))
    started = time.monotonic()
    parties.start(
        "server",
        [
            str(flower_bin / "flower-superlink"), "--ssl-ca-certfile", str(ca), "--ssl-certfile", str(certificate),
            "--ssl-keyfile", str(key), "--disable-runtime-dependency-installation",
            "--host", "127.0.0.1", "--port", str(port),
        ],
    )  # fmt: skip
    wait_for_port(port, parties)
    names = site_names(SITES)
    for index, name in enumerate(names):
        parties.start(
            name,
            [
                str(flower_bin / "flower-supernode"), "--root-certificates", str(ca), "--superlink", relay.address,
                "--port", str(free_port()), "--node-config", f"partition-id={index} num-partitions={SITES}",
            ],
        )  # fmt: skip
    connection = [f'address = "127.0.0.1:{port}"', f'root-certificates = "{ca}"']
    try:
        trained, wall = flwr_run(settings, flower_bin, parties, connection, [], started)
    finally:
        relay.close()
    return Run(
        "Flower", wall, parties.cpu(), relay.up, relay.down, trained["theta"], float(trained["c"]), settings.rounds
    )


SIMULATION = "Flower, simulation engine"


def run_flower_simulation(settings: Settings, folder: Path, flower_bin: Path) -> Run:
    """Flower's simulation engine: a SuperLink that simulates (its Ray backend, one ClientApp actor a core), three
    virtual SuperNodes, `flwr run` of the example. One party: everything runs in the SuperLink's process tree, and
    nothing crosses a network (the Control API that `flwr run` submits to is the operator's, not counted)."""
    parties = Parties(folder, flower_environment(folder, flower_bin))
    port = free_port()
    started = time.monotonic()
    parties.start(
        "server",
        [
            str(flower_bin / "flower-superlink"), "--insecure", "--simulation",
            "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(port),
        ],
    )  # fmt: skip
    wait_for_port(port, parties)
    connection = [f'address = "127.0.0.1:{port}"', "insecure = true"]
    # One CPU an actor, so each core runs a ClientApp as each fedfair collaborator process has one compute thread.
    options = ["--federation-config", f"num-supernodes={SITES} client-resources-num-cpus=1"]
    trained, wall = flwr_run(settings, flower_bin, parties, connection, options, started)
    return Run(SIMULATION, wall, parties.cpu(), None, None, trained["theta"], float(trained["c"]), settings.rounds)


def relative(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a), np.asarray(b)
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


COSTS = (
    "wall_seconds",
    "cpu_seconds_total",
    "server_cpu_seconds",
    "site_cpu_seconds_median",
    "client_app_actor_cpu_seconds",
)
"""The figures fitted as start-up plus a cost per round, those of them that a system's runs have."""


def per_round_costs(summaries: list[dict[str, Any]], project: int) -> dict[str, dict[str, float | None]]:
    """Each of COSTS over `summaries` (one system's runs, at two round counts or more) as a least-squares line in
    the rounds: its intercept (start-up, joining, the end), its slope (a round), and its value at `project`.

    A negative slope is no cost (the shorter runs took longer: the machine, not the rounds): it is None, and so is
    the projection."""
    rounds = [summary["rounds"] for summary in summaries]
    fitted: dict[str, dict[str, float | None]] = {}
    for cost in (cost for cost in COSTS if all(cost in summary for summary in summaries)):
        line = statistics.linear_regression(rounds, [summary[cost] for summary in summaries])
        measured = line.slope >= 0
        fitted[cost] = {
            "start_up": round(line.intercept, 1) if measured else None,
            "per_round": round(line.slope, 3) if measured else None,
            f"at_{project}_rounds": round(line.intercept + line.slope * project) if measured else None,
        }
    return fitted


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["party"]:
        return party(Path(arguments[1]), arguments[3:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, nargs="+", default=[20], help="round counts, each run (default 20)")
    parser.add_argument(
        "--project",
        type=int,
        default=200,
        help="with two round counts or more, the rounds to project each system's fitted costs to (default 200)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs of each system, interleaved (default 2)")
    parser.add_argument("--batch-fraction", type=float, default=0.03, help="b_k = round(f n_k) (default 0.03)")
    parser.add_argument(
        "--engine",
        choices=("deployment", "simulation"),
        default="deployment",
        help="Flower's engine: SuperLink and SuperNodes as processes over TLS, or its simulation (Ray backend)",
    )
    parser.add_argument("--secure", action="store_true", help="fedfair with its secure sums (fixed point)")
    parser.add_argument("--flower-venv", type=Path, default=ROOT / ".venv-flower", help="make test-flower's venv")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(arguments)
    flower_bin = args.flower_venv.resolve() / "bin"
    if not (flower_bin / "flwr").exists():
        parser.error(f"no Flower in {args.flower_venv}; build it with `make test-flower` (or pass --flower-venv)")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="flower-bench-") as scratch:
        for repeat in range(args.repeats):
            for rounds in args.rounds:
                settings = Settings(rounds=rounds, batch_fraction=args.batch_fraction)
                for system in ("fedfair", args.engine):
                    folder = Path(scratch) / f"{system}-{repeat}-{rounds}"
                    folder.mkdir()
                    if system == "fedfair":
                        runs.append(run_fedfair(settings, folder, args.secure))
                    elif system == "simulation":
                        runs.append(run_flower_simulation(settings, folder, flower_bin))
                    else:
                        runs.append(run_flower(settings, folder, flower_bin))
                    print(json.dumps(runs[-1].summary()), file=sys.stderr, flush=True)
    longest = max(args.rounds)
    ours = [run for run in runs if run.system.startswith("fedfair") and run.rounds == longest]
    flowers = [run for run in runs if run.system.startswith("Flower") and run.rounds == longest]
    document: dict[str, Any] = {
        "settings": vars(Settings(rounds=longest, batch_fraction=args.batch_fraction))
        | {
            "round_counts": args.rounds,
            "sites": SITES,
            "secure": args.secure,
            "engine": args.engine,
            "task": "examples/flower-fedsrcvar",
        },
        "runs": [run.summary() for run in runs],
        "equality": {
            "rounds": longest,
            "theta_average_relative": relative(flowers[0].theta_average, ours[0].theta_average),
            "c_average_difference": abs(flowers[0].c_average - ours[0].c_average),
            "c_average_relative": abs(flowers[0].c_average - ours[0].c_average) / abs(ours[0].c_average),
            "repeats_identical": all(run.theta_average == ours[0].theta_average for run in ours)
            and all(run.theta_average == flowers[0].theta_average for run in flowers),
        },
    }
    if len(set(args.rounds)) > 1:
        document["per_round"] = {
            "project": args.project,
            "systems": {
                system: per_round_costs([run.summary() for run in runs if run.system == system], args.project)
                for system in dict.fromkeys(run.system for run in runs)
            },
        }
    publish(document, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
