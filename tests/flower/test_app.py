"""The example Flower App run as a Flower user runs it: `flwr run` against a SuperLink, simulated and deployed.

The deployment is real processes on loopback: a SuperLink serving TLS with a certificate from fedfair's own PKI,
three SuperNodes (one per race group of Adult) that trust only that CA, and `flwr run` submitting the app. Its
held-out worst-decile risk must be fedfair's own run's (`fedfair.api.federate`, same settings and split).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedfair import pki  # noqa: E402
from fedfair.api import federate  # noqa: E402
from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig  # noqa: E402
from fedfair.core.data import client_batch_sizes  # noqa: E402
from fedfair.flower import FlowerSettings, initial_arrays  # noqa: E402
from fedfair.flower.settings import read_pair  # noqa: E402
from fedfair.runtime.local.workspace import free_port, listening  # noqa: E402
from tests.flower.quantisation import first_round_under_secaggplus  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "flower-fedsrcvar"
BIN = Path(sys.executable).parent
SITES = 3


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (Flower's SuperLink starts its SuperExec in a session of its own)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


class Processes:
    """The processes a test starts, each logging to a file; all of them, and all they started, end with the test."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        self.env = env
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.folder / f"{name}.log").open("wb")
        process = subprocess.Popen([str(BIN / args[0]), *args[1:]], stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.started.append(process)
        return process

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(self.folder.glob("*.log")))

    def stop(self) -> None:
        pids = [pid for process in self.started for pid in (*descendants(process.pid), process.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.started:
            process.wait(timeout=30)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    (tmp_path / "flwr-home").mkdir()
    running = Processes(tmp_path, env)
    yield running
    running.stop()


def wait_for_port(port: int, processes: Processes, seconds: float = 60.0) -> None:
    assert listening(port, seconds), f"nothing listened on port {port} within {seconds:.0f} s\n{processes.logs()}"


def flwr_run(processes: Processes, connection: str, lines: list[str], run_config: str) -> None:
    """`flwr run` of the example against the named SuperLink connection, streamed until the run ends."""
    config = Path(processes.env["FLWR_HOME"]) / "config.toml"
    config.write_text(
        "\n".join(["[superlink]", f'default = "{connection}"', "", f"[superlink.{connection}]", *lines]) + "\n"
    )
    command = [str(BIN / "flwr"), "run", str(EXAMPLE), connection, "--stream", "--run-config", run_config]
    if connection == "simulation":
        command += ["--federation-config", f"num-supernodes={SITES}"]
    done = subprocess.run(command, env=processes.env, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, f"flwr run failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}\n{processes.logs()}"


def read_result(path: Path, processes: Processes) -> dict[str, float]:
    assert path.exists(), f"the ServerApp wrote no result\n{processes.logs()}"
    return dict(json.loads(path.read_text()))


def test_flwr_run_of_the_example_completes_in_the_simulation_engine(processes: Processes, tmp_path: Path) -> None:
    port = free_port()
    processes.start(
        "superlink", "flower-superlink", "--insecure", "--simulation", "--disable-runtime-dependency-installation",
        "--host", "127.0.0.1", "--port", str(port),
    )  # fmt: skip
    wait_for_port(port, processes)
    result_file = tmp_path / "simulation.json"
    flwr_run(
        processes,
        "simulation",
        [f'address = "127.0.0.1:{port}"', "insecure = true"],
        f"num-server-rounds=3 result-file='{result_file}'",
    )
    result = read_result(result_file, processes)
    assert result["rounds"] == 3
    # Three rounds of eta_c = 0.1 move c down from B = 10 by about 0.1 a round, never out of [0, B].
    assert 9.0 < result["c"] < 10.0
    assert math.isfinite(result["worst_decile_risk"]) and result["worst_decile_risk"] > result["mean_risk"] > 0.0


def write_tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """fedfair's PKI: a CA, and the SuperLink's certificate (loopback in its names) and key, as PEM files."""
    pki.init_ca(folder)
    certificate = pki.issue(folder, "aggregator", "superlink", hosts=["localhost", "127.0.0.1"])
    return folder / "ca.crt", certificate, folder / "superlink.key"


DEPLOYED_ROUNDS = 3
"""Each round every SuperNode starts a fresh ClientApp process (torch, Flower and Adult loaded anew), so a round
costs three interpreter starts: at 3 rounds the test took about 3 minutes on 2 loaded cores."""


def deploy(processes: Processes, tmp_path: Path) -> list[str]:
    """A SuperLink serving TLS and one SuperNode per site; the connection's lines for `flwr_run`."""
    ca, certificate, key = write_tls_files(tmp_path)
    port = free_port()
    processes.start(
        "superlink", "flower-superlink", "--ssl-ca-certfile", str(ca), "--ssl-certfile", str(certificate),
        "--ssl-keyfile", str(key), "--disable-runtime-dependency-installation",
        "--host", "127.0.0.1", "--port", str(port),
    )  # fmt: skip
    wait_for_port(port, processes)
    for site in range(SITES):
        processes.start(
            f"supernode-{site}", "flower-supernode", "--root-certificates", str(ca),
            "--superlink", f"127.0.0.1:{port}", "--port", str(free_port()),
            "--node-config", f"partition-id={site} num-partitions={SITES}",
        )  # fmt: skip
    return [f'address = "127.0.0.1:{port}"', f'root-certificates = "{ca}"']


def example_task() -> ModuleType:
    sys.path.insert(0, str(EXAMPLE))
    try:
        return importlib.import_module("fedsrcvar_app.task")
    finally:
        sys.path.remove(str(EXAMPLE))


def test_a_deployment_over_tls_reaches_fedfairs_own_worst_decile_risk(processes: Processes, tmp_path: Path) -> None:
    connection = deploy(processes, tmp_path)
    result_file = tmp_path / "deployment.json"
    flwr_run(processes, "deployment", connection, f"num-server-rounds={DEPLOYED_ROUNDS} result-file='{result_file}'")
    deployed = read_result(result_file, processes)

    task = example_task()
    model, held_out_risks = task.model, task.held_out_risks
    sites = [train for train, _ in task.adult_by_race()]
    # The example's run config: fedfair.api.federate's defaults but rho and the rounds.
    own = federate(model, sites, rho=0.2, epsilon=0.1, rounds=DEPLOYED_ROUNDS)
    expected = held_out_risks(own.model)
    assert deployed["c"] == pytest.approx(own.threshold, rel=1e-6)
    # The acceptance bound is 0.01; the two runs take the same steps, so they agree to float32 rounding.
    assert abs(deployed["worst_decile_risk"] - expected["worst_decile_risk"]) < 0.01
    assert abs(deployed["worst_decile_risk"] - expected["worst_decile_risk"]) < 1e-4


def test_secaggplus_masks_each_round_and_the_pair_moves_within_its_quantisation_bound(
    processes: Processes, tmp_path: Path
) -> None:
    """One round deployed under Flower's SecAgg+: the new pair is the sites' weighted mean up to quantisation."""
    connection = deploy(processes, tmp_path)
    result_file = tmp_path / "secaggplus.json"
    flwr_run(processes, "deployment", connection, f"num-server-rounds=1 secaggplus=true result-file='{result_file}'")
    masked = read_result(result_file, processes)

    task = example_task()
    settings = FlowerSettings(ObjectiveConfig(epsilon=0.1, rho=0.2), LocalConfig())  # the example's run config
    sites = [train for train, _ in task.adult_by_race()]
    total_batch = TrainingConfig.batch_size  # the example's max_weight, too
    shares = client_batch_sizes([len(labels) for _, labels in sites], total_batch)
    start = read_pair(initial_arrays(task.model))
    exact, bound, move = first_round_under_secaggplus(task.model, sites, settings, shares, total_batch, start)
    secured = np.concatenate([np.array(masked["last_theta"]), [masked["last_c"]]])
    error = np.abs(secured - exact).max()
    assert error <= bound, f"SecAgg+ moved the pair {error:.3g} from the weighted mean, beyond its bound {bound:.3g}"
    # Quantisation did happen (the pair came through SecAgg+, not a plain sum) and the round moved the pair.
    assert error > 0.0
    assert move > 100 * bound
