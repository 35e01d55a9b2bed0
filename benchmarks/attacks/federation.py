"""The federation the attacks run against, built with fedfair itself.

- :func:`attack_workspace`: certificates, plan and configs (``make_workspace``), plus the
  credentials an attacker might hold: a certificate of a name the plan does not list,
  one from another CA, an expired one, a listed name with the aggregator's role, and the
  aggregator's own certificate used as a client's;
- :class:`AggregatorProcess`: the real aggregator as an OS process (so it can crash, be
  killed with SIGKILL and resumed);
- :class:`HonestCollaborators`: real :class:`~fedfair.runtime.collaborator.client.Collaborator`
  objects in threads, with trainers whose updates are exact in binary (:func:`exact_update`,
  :class:`DriftTrainer`), so sums over any order, plain or through the fixed-point
  encoding, are the same bits and the round log can be checked number for number;
- checking the round log against what every party sent: :mod:`attacks.round_check`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from cryptography.hazmat.primitives import serialization

from attacks.hostile_client import Credentials
from attacks.patience import patient
from fedfair import pki
from fedfair.core import server
from fedfair.core.local import LocalLearner, RoundTrainer
from fedfair.core.update import Update
from fedfair.core.models import flat_parameters
from fedfair.runtime.local.processes import Child, child_environment
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import CollaboratorConfig, load_collaborator_config
from fedfair.runtime.peer.retries import RetryPolicy
from fedfair.runtime.collaborator.trainer import TrainerFactory
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, SharedSettings, load_aggregator_plan

FEDERATION_ID = "fedfair-launch"  # what make_workspace writes
EXACT_UPDATE_NORM = 1e3
"""[influence] update_norm of the attack plans: above any exact trainer's update (DriftTrainer's reach 4 per
coordinate), so no honest collaborator rescales one and every sum stays exact."""
HONEST = ("site-a", "site-b", "site-c")
INSIDER = "site-m"
"""A listed collaborator whose process is the hostile client (an institution gone rogue)."""
PATCHED = "site-p"
"""A listed collaborator running fedfair's own code with one secure-aggregation step corrupted."""
STRANGER = "mallory"
"""A certificate from the federation's CA for a name the plan does not list."""

FAST_RETRY = RetryPolicy(attempts=90, base_seconds=0.2, cap_seconds=1.0)
"""Honest collaborators reconnect within a second of the aggregator's restart (the default waits up to 15 s
between attempts), and keep trying for about a minute: a restart can take many seconds on a loaded machine."""

AGGREGATOR_SCRIPT = Path(__file__).with_name("aggregator_process.py")
STARTUP_SECONDS = 120.0


# ---------------------------------------------------------------- certificates an attacker might hold


@dataclass(frozen=True)
class AttackCredentials:
    """Every certificate the hostile client presents, as PEM files."""

    insider: Credentials
    honest: Credentials
    none: Credentials
    foreign_ca: Credentials
    expired: Credentials
    wrong_role: Credentials
    aggregator_as_client: Credentials
    stranger: Credentials


def plan_sections(
    *,
    secure: bool,
    rounds: int,
    quorum: int,
    timeout: float,
    evaluation_every: int = 0,
    **extra: Mapping[str, Any],
) -> dict[str, dict[str, Any]]:
    """The plan's learning sections for an attack federation (cheap rounds: logistic regression on Adult).

    Weights are equal (each site's agreed weight is 1, :func:`exact_update`'s) and the update bound
    is far above the exact trainers' updates, so every sum stays exact in binary; the influence
    rows (:mod:`attacks.influence`) exercise the bound and declared weights themselves."""
    sections: dict[str, dict[str, Any]] = {
        "objective": {"epsilon": 0.1, "rho": 0.3},
        "training": {"rounds": rounds, "local_steps": 2, "batch_fraction": 0.01, "lr": 0.1, "threshold_lr": 0.1},
        "influence": {"weights": "equal", "update_norm": EXACT_UPDATE_NORM},
        "secure_aggregation": {"enabled": secure},
        "quorum": {"min_collaborators": quorum, "round_timeout_seconds": timeout},
        "evaluation": {"every": evaluation_every},
        "aggregator": {"report": False},  # no row reads the end-of-run page: 1.5 CPU-s a federation saved
    }
    for section, values in extra.items():
        sections.setdefault(section, {}).update(values)
    return sections


def attack_workspace(root: Path, names: Sequence[str], plan: Mapping[str, Mapping[str, Any]]) -> Workspace:
    """make_workspace, plus the extra credentials of :func:`attack_credentials` under `root`."""
    workspace = make_workspace(root, names, plan=plan)
    certs = workspace.certs
    pki.issue(certs, "collaborator", STRANGER)
    foreign = root / "foreign-ca"
    pki.init_ca(foreign)
    pki.issue(foreign, "collaborator", INSIDER)
    ca_certificate, ca_key = pki.load_certificate(certs / "ca.crt"), pki.load_private_key(certs / "ca.key")
    insider_key = pki.load_private_key(certs / f"{INSIDER}.key")
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    expired = pki.sign_request(
        pki.create_request(INSIDER, insider_key), ca_certificate, ca_key, "collaborator", days=2, not_before=past
    )
    wrong_role = pki.sign_request(pki.create_request(INSIDER, insider_key), ca_certificate, ca_key, "aggregator")
    for folder, certificate in (("expired", expired), ("wrong-role", wrong_role)):
        (root / folder).mkdir()
        (root / folder / f"{INSIDER}.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return workspace


def attack_credentials(workspace: Workspace) -> AttackCredentials:
    certs, root = workspace.certs, workspace.root
    ca = certs / "ca.crt"

    def own(name: str, folder: Path = certs, key_folder: Path = certs) -> Credentials:
        return Credentials(ca, folder / f"{name}.crt", key_folder / f"{name}.key")

    return AttackCredentials(
        insider=own(INSIDER),
        honest=own(HONEST[0]),
        none=Credentials(ca),
        foreign_ca=own(INSIDER, root / "foreign-ca", root / "foreign-ca"),
        expired=own(INSIDER, root / "expired"),
        wrong_role=own(INSIDER, root / "wrong-role"),
        aggregator_as_client=own("aggregator"),
        stranger=own(STRANGER),
    )


# ---------------------------------------------------------------- exact updates


def wire_ulp_up(value: float) -> float:
    """`value` moved one ulp up as a model download carries it: the next float32 above float32(value).

    Built-in models travel in float32 (`fedfair.runtime.contract.model_download`), so a float64 ulp is the same
    model on the wire; a cheat that wants another model digest moves a float32 ulp.
    """
    return float(np.nextafter(np.float32(value), np.float32(np.inf)))


def kept_state(state: server.ServerState) -> server.ServerState:
    """A copy of `state` a cheating aggregator keeps to put back later: the loop's server step forms the next
    state in the given one's tensors (`fedfair.core.server.apply`, `consume`)."""
    return dataclasses.replace(
        state,
        theta=state.theta.clone(),
        theta_average=state.theta_average.clone(),
        control=None if state.control is None else state.control.clone(),
        velocity=None if state.velocity is None else state.velocity.clone(),
        second_moment=None if state.second_moment is None else state.second_moment.clone(),
    )


def exact_update(name: str, parameters: int) -> Update:
    """A collaborator's fixed update: small multiples of 2^-8 and the weight 1 that the attack plans
    agree for every site, so every sum of such updates (in any order, plain or fixed-point with 20
    fractional bits) is exact."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    rng = np.random.default_rng(seed)
    delta = torch.from_numpy(rng.integers(-32, 33, size=parameters).astype(np.float64) / 256.0)
    return Update(delta=delta, delta_c=float(rng.integers(-8, 9)) / 256.0, weight=1.0)


def plain_vector(update: Update) -> np.ndarray:
    """What a collaborator uploads in plain mode for `update`: [w * delta, w * delta_c, w]."""
    return np.append(update.weighted_vector().numpy(), update.weight)


class FixedTrainer:
    """The same exact update every round, whatever the model (no local training)."""

    def __init__(self, update: Update) -> None:
        self.update = update

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update:
        return self.update


class DriftTrainer:
    """An update that depends on the model, still exact: delta = q(-theta / 4 + u), q rounding to 2^-10.

    Deterministic and stateless, so an aggregator that is killed and resumed must land on
    exactly the model an uninterrupted run reaches, through the secure encoding too.
    """

    def __init__(self, update: Update) -> None:
        self.base = update

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update:
        delta = torch.round((-0.25 * theta.to(torch.float64) + self.base.delta) * 1024.0) / 1024.0
        delta_c = round((-0.25 * c + self.base.delta_c) * 1024.0) / 1024.0
        return Update(delta=delta.clamp(-4.0, 4.0), delta_c=delta_c, weight=self.base.weight)


def trainer_factory(name: str, kind: type[FixedTrainer | DriftTrainer]) -> TrainerFactory:
    """The privacy hook of Collaborator, used to plug in an exact trainer sized to the plan's model."""

    def make(learner: LocalLearner, config: CollaboratorConfig, shared: SharedSettings) -> RoundTrainer:
        return kind(exact_update(name, int(flat_parameters(learner.model).numel())))

    return make


# ---------------------------------------------------------------- the processes


class AggregatorProcess:
    """The aggregator as an OS process, its log in a file (and in memory, for scanning)."""

    def __init__(self, workspace: Workspace, *, resume: bool = False, fault: str | None = None) -> None:
        log = workspace.root / "aggregator.log"
        self.sink: IO[str] = log.open("a", encoding="utf-8")
        command = [sys.executable, str(AGGREGATOR_SCRIPT), str(workspace.plan), *(["--resume"] if resume else [])]
        env = {"FEDFAIR_TEST_FAULT": fault} if fault else {}
        self.child = Child("aggregator", command, env=child_environment(env), sink=self.sink, watch="listening on port")
        if not self.child.seen.wait(patient(STARTUP_SECONDS)) or self.child.process.poll() is not None:
            self.child.kill()
            raise RuntimeError(f"the aggregator did not start; see {log}")

    @property
    def alive(self) -> bool:
        return self.child.process.poll() is None

    @property
    def pid(self) -> int:
        return self.child.process.pid

    def wait(self, timeout: float) -> int | None:
        """Its exit status, or None if it is still running after `timeout` seconds, stretched by the machine's
        load (:func:`~attacks.patience.patient`; its threads' stacks then go to the log, to show where it is stuck)."""
        try:
            return self.child.process.wait(patient(timeout))
        except subprocess.TimeoutExpired:
            self.child.process.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            return None

    def stop(self) -> None:
        self.child.kill()
        self.sink.close()

    def problems(self) -> list[str]:
        """Log lines that show the aggregator failed on its own side (tracebacks, internal errors)."""
        markers = ("Traceback", "Exception calling application", " ERROR ")
        return [line for line in self.child.lines if any(marker in line for marker in markers)]


@dataclass
class HonestCollaborators:
    """Real collaborators in threads of this process."""

    collaborators: dict[str, Collaborator]
    errors: dict[str, str] = field(default_factory=dict)
    threads: dict[str, threading.Thread] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        workspace: Workspace,
        names: Iterable[str],
        trainers: Callable[[str], TrainerFactory | None],
        *,
        adjust: Callable[[str, Collaborator], None] | None = None,
    ) -> HonestCollaborators:
        """Start one Collaborator per name (`trainers(name)` None: its real learner on its Adult part)."""
        configs = {name: load_collaborator_config(workspace.configs[name]) for name in names}
        return cls.launch(configs, trainers, adjust=adjust)

    @classmethod
    def launch(
        cls,
        configs: Mapping[str, CollaboratorConfig],
        trainers: Callable[[str], TrainerFactory | None],
        *,
        adjust: Callable[[str, Collaborator], None] | None = None,
    ) -> HonestCollaborators:
        """Start one Collaborator per ready-made config (e.g. one changed from what its file says)."""
        instances: dict[str, Collaborator] = {}
        for name, config in configs.items():
            factory = trainers(name)
            collaborator = (
                Collaborator(config, retry=FAST_RETRY)
                if factory is None
                else Collaborator(config, trainer_factory=factory, retry=FAST_RETRY)
            )
            if adjust is not None:
                adjust(name, collaborator)
            instances[name] = collaborator
        group = cls(instances)
        for name, collaborator in instances.items():
            group.threads[name] = threading.Thread(
                target=group._run, args=(name, collaborator), name=f"honest-{name}", daemon=True
            )
            group.threads[name].start()
        return group

    def _run(self, name: str, collaborator: Collaborator) -> None:
        try:
            collaborator.run()
        except Exception as error:  # noqa: BLE001 -- reported in the rows, not lost in a thread
            where = traceback.extract_tb(error.__traceback__)[-1]
            self.errors[name] = f"{type(error).__name__}: {error} (at {Path(where.filename).name}:{where.lineno})"

    def join(self, timeout: float) -> list[str]:
        """Wait for every collaborator to finish; return those still running."""
        for thread in self.threads.values():
            thread.join(timeout)
        return [name for name, thread in self.threads.items() if thread.is_alive()]

    def stop(self) -> None:
        for collaborator in self.collaborators.values():
            collaborator.stop()


def load_plan(workspace: Workspace) -> AggregatorPlan:
    return load_aggregator_plan(workspace.plan)
