"""A cheating aggregator against honest collaborators: equivocation and Sybil rosters.

The aggregator here is fedfair's own (``prepare``, ``serve``, ``RoundLoop`` from
:mod:`fedfair.runtime.aggregator.loop`), run in a thread of this process with its relay
patched, against real collaborators in threads. The question each row asks is whether
the *honest collaborators* refuse.

- Equivocation: in one round the aggregator shows one collaborator (the viewer) a
  different outcome of MASKED_INPUT than everyone else: that another collaborator (the
  subject) dropped out, in the survivor set of CONSISTENCY and in the unmask request.
  Believing it, the viewer would reveal its share of the subject's mask key while the
  others reveal their shares of the subject's self-mask seed: both secrets of one
  party, its input in the clear. Every unmasking upload the aggregator receives is
  recorded (before its own checks), so the row sees exactly what leaked. The lie buys the
  aggregator nothing else: on the complete graph the other survivors re-sum the claim from
  the inputs their own views fix, so the viewer's missing tag does not void the round, and
  its sum, applied, is exactly the honest updates (docs/security.md, "Verified aggregation").
- Sybil roster: the operator holds the CA. It runs a round whose roster is one
  institution plus parties of its own (names outside the institutions' manifest), and
  a round with twins: certificates it minted for the other institutions' names with
  keys of its own. The institution must never put its input in such a round.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attacks.hostile_client import Stage, named_stage, stage_name, stage_of
from attacks.federation import (
    FixedTrainer,
    HonestCollaborators,
    exact_update,
    plain_vector,
    plan_sections,
    trainer_factory,
)
from attacks.round_check import Sent, check_rounds
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair import pki
from fedfair.pki.roster import Roster, pin_certificate, write_manifest
from fedfair.pki.store import write_file
from fedfair.runtime.aggregator.stages import UploadHandler
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.aggregator.network import Network, serve
from fedfair.runtime.aggregator.start import GOODBYE_SECONDS, prepare
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.manifest import load_manifest
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, load_aggregator_plan, plan_digest
from fedfair.runtime.transport import TlsFiles
from fedfair.runtime.transport import fedfair_pb2 as pb
from fedfair.secagg import messages

FOUR = ("site-a", "site-b", "site-c", "site-d")
VIEWER, SUBJECT = "site-a", "site-d"
LIE_ROUND, ROUNDS = 2, 3
CHEAT_TIMEOUT = 15.0
SYBILS = ("sybil-1", "sybil-2")
REFUSAL_WORDS = ("manifest", "pinned", "roster", "not trusted", "withdraw")
"""Words of the log line that shows why the institution kept out of a round (shown in the row)."""


class PatchedAggregator:
    """fedfair's aggregator in a thread, with `patch(network)` applied to its relay before the first round."""

    def __init__(self, plan: AggregatorPlan, patch: Callable[[Network], None]) -> None:
        self.plan, self.patch = plan, patch
        self.network: Network | None = None
        self.error: str | None = None
        self.listening = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cheating-aggregator", daemon=True)
        self.thread.start()
        self.listening.wait(60)

    def _run(self) -> None:
        try:
            checkpoint = prepare(self.plan, resume=False)
            network = serve(self.plan, plan_digest(self.plan))
            self.network = network
            self.patch(network)
            self.listening.set()
            try:
                RoundLoop(self.plan, network, checkpoint).run()
                network.board.wait_until_alone(GOODBYE_SECONDS)
            finally:
                network.stop()
        except Exception as error:  # noqa: BLE001 -- reported in the row
            self.error = f"{type(error).__name__}: {error}"
        finally:
            self.listening.set()

    def stop(self) -> None:
        if self.network is not None:
            self.network.board.close()
        self.thread.join(30)


# ---------------------------------------------------------------- equivocation


@dataclass
class Equivocation:
    """Shows the viewer a view of MASKED_INPUT without the subject, and does all a cheater can to make it unmask.

    In the lied round the relay gives the viewer a survivor set without the subject (CONSISTENCY),
    takes the viewer's signature over that false view itself instead of letting fedfair's server
    refuse it, keeps the viewer in the UNMASK stage (gate and board) and hands it an unmask
    request naming the subject as dropped, carrying the honest parties' signatures and the
    viewer's own. The stage waits for the viewer's answer. Every unmasking upload of the round
    is recorded before anything checks it; the viewer's goes no further.
    """

    viewer: str
    subject_id: int
    lies_told: list[str] = field(default_factory=list)
    revealed: list[tuple[str, str, int, str]] = field(default_factory=list)
    """(stage, responder, owner, "seed" | "mask key") for every share in every unmasking upload of the lied round."""
    viewer_signature: tuple[int, bytes] | None = None

    def install(self, network: Network) -> None:
        board, gate = network.board, network.gate
        open_stage, open_gate = board.open_stage, gate.open
        lied = (named_stage("STAGE_CONSISTENCY"), named_stage("STAGE_UNMASK"))

        def cheating_gate(round_number: int, stage: Stage, **options: Any) -> pb.Binding:
            if (
                round_number == LIE_ROUND
                and stage == named_stage("STAGE_UNMASK")
                and options.get("participants") is not None
            ):
                options["participants"] = {*options["participants"], self.viewer}
            return open_gate(round_number, stage, **options)

        def cheating_open_stage(
            binding: pb.Binding,
            expected: Any,
            inputs: bytes | Mapping[str, bytes],
            handler: UploadHandler,
            **options: Any,
        ) -> None:
            stage = stage_of(binding)
            if binding.round == LIE_ROUND and stage in lied:
                expected = {*expected, self.viewer}
                inputs = self._lie(stage, expected, inputs)
                handler = self._intercept(stage_name(stage), handler)
                options["ready"] = None  # wait for the viewer's answer, however many shares the others gave
            open_stage(binding, expected, inputs, handler, **options)

        gate.open = cheating_gate  # type: ignore[method-assign]
        board.open_stage = cheating_open_stage  # type: ignore[method-assign]

    def _lie(self, stage: Stage, expected: Any, inputs: bytes | Mapping[str, bytes]) -> Mapping[str, bytes]:
        per_peer = {peer: inputs if isinstance(inputs, bytes) else inputs.get(peer, b"") for peer in expected}
        truth = next((payload for payload in per_peer.values() if payload), b"")
        if not truth:
            return per_peer
        message = messages.decode(truth)
        subject = self.subject_id
        lie: messages.Message
        if isinstance(message, messages.SurvivorSet) and subject in message.survivors:
            lie = dataclasses.replace(message, survivors=tuple(p for p in message.survivors if p != subject))
        elif isinstance(message, messages.UnmaskRequest) and subject in message.survivors:
            signatures = message.signatures + ((self.viewer_signature,) if self.viewer_signature else ())
            lie = dataclasses.replace(
                message,
                survivors=tuple(p for p in message.survivors if p != subject),
                dropped=tuple(sorted((*message.dropped, subject))),
                signatures=tuple(sorted(signatures)),
            )
        else:
            return per_peer
        per_peer[self.viewer] = lie.to_bytes()
        self.lies_told.append(f"{stage_name(stage)}: {type(message).__name__} without party {self.subject_id}")
        return per_peer

    def _intercept(self, stage: str, handler: UploadHandler) -> UploadHandler:
        def intercept(peer: str, payload: bytes) -> None:
            message: messages.Message | None
            try:
                message = messages.decode(payload)
            except Exception:  # noqa: BLE001 -- not a secure-aggregation message: nothing to read in it
                message = None
            if isinstance(message, messages.UnmaskResponse):
                self.revealed += [(stage, peer, share.owner, "seed") for share in message.seed_shares]
                self.revealed += [(stage, peer, share.owner, "mask key") for share in message.key_shares]
            if peer != self.viewer:
                handler(peer, payload)
            elif isinstance(message, messages.ConsistencySignature):
                self.viewer_signature = (message.sender, message.signature)

        return intercept

    def both_secrets(self) -> list[int]:
        """Parties whose seed shares and mask-key shares both reached the aggregator in one aggregation."""
        kinds: dict[tuple[str, int], set[str]] = {}
        for stage, _, owner, kind in self.revealed:
            kinds.setdefault((stage, owner), set()).add(kind)
        return sorted({owner for (_, owner), seen in kinds.items() if len(seen) == 2})


def equivocation_row(root: Path, book: RowBook) -> None:
    with book.row(
        "equivocation: one collaborator is told another dropped out (survivor set and unmask request)",
        "the viewer finds no t consistency signatures on the view it was shown and reveals no share in that "
        "round; no party's seed and mask key both reach the aggregator; that round's sum is still the true one "
        "(the other survivors each re-sum the claim from the inputs their own views fix, so the viewer's missing "
        "tag does not void it on the complete graph): applied, exactly the honest updates, as is every later "
        "round; no site refuses an honest round: the viewer, which verified no sum of the lied round, catches up on "
        "it (it checks the sum the aggregator kept of that round as its survivors did, issue 98), trains every "
        "later round on a model it checked and ends with no error and the federation's bundle",
        PATCHED_AGGREGATOR,
    ) as row:
        workspace = make_workspace(
            root, FOUR, plan=plan_sections(secure=True, rounds=ROUNDS, quorum=4, timeout=CHEAT_TIMEOUT)
        )
        plan = load_aggregator_plan(workspace.plan)
        lie = Equivocation(VIEWER, FOUR.index(SUBJECT) + 1)
        aggregator = PatchedAggregator(plan, lie.install)
        group = HonestCollaborators.start(workspace, FOUR, lambda name: trainer_factory(name, FixedTrainer))
        try:
            group.join(120)
        finally:
            group.stop()
            aggregator.stop()
        log = {record["round"]: record for record in read_round_log(workspace.output)}
        check = check_rounds(plan, workspace, _honest_sum(plan, FOUR))
        viewer_shares = [f"{kind} of {owner}" for stage, peer, owner, kind in lie.revealed if peer == VIEWER]
        both = lie.both_secrets()
        exact = [number for number in range(LIE_ROUND, ROUNDS + 1) if number in check.verified]
        viewer = group.errors.get(VIEWER)
        others = {name: error for name, error in group.errors.items() if name != VIEWER}
        viewer_bundle = bool(list(workspace.configs[VIEWER].parent.glob(f"{VIEWER}.*.model_bundle.pt")))
        statuses = {number: log.get(number, {}).get("status") for number in range(LIE_ROUND, ROUNDS + 1)}
        row.record(
            f"lies told: {lie.lies_told or 'none (the stages never opened)'}; the viewer revealed "
            f"{viewer_shares or 'no share'}; both secrets of {both or 'nobody'} reached the aggregator; rounds "
            f"{statuses}, exactly the honest updates: {exact}; the viewer: {viewer or 'no error'}, "
            f"{'a' if viewer_bundle else 'no'} bundle; the other sites' errors: {others or 'none'}",
            bool(lie.lies_told)
            and not viewer_shares
            and not both
            and exact == list(range(LIE_ROUND, ROUNDS + 1))
            and not check.invalid
            and viewer is None
            and viewer_bundle
            and not others
            and aggregator.error is None,
            revealed=[list(item) for item in lie.revealed],
            errors={**group.errors, **({"aggregator": aggregator.error} if aggregator.error else {})},
        )


def _honest_sum(plan: AggregatorPlan, names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], Sent | str]:
    parameters = int(initial_state(plan).theta.numel())

    def sent(record: Mapping[str, Any]) -> Sent | str:
        counted = record.get("contributors", [])
        if any(name not in names for name in counted):
            return f"round {record['round']}: a party outside the federation was counted"
        return Sent({name: plain_vector(exact_update(name, parameters)) for name in counted})

    return sent


# ---------------------------------------------------------------- Sybil rosters


@contextmanager
def collaborator_log(name: str | None = None) -> Iterator[list[str]]:
    """Every warning or error the collaborator `name` (None: every collaborator) logs while the block runs."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if name is None or message.startswith(f"{name}:"):
                lines.append(message)

    logger = logging.getLogger("fedfair.collaborator")
    handler, level, propagate = Collect(logging.WARNING), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def sybil_workspace(root: Path) -> tuple[Workspace, Path]:
    """The honest federation (site-a, site-b, site-c) and the manifest its institutions agreed on."""
    workspace = make_workspace(
        root, FOUR[:3], plan=plan_sections(secure=True, rounds=1, quorum=3, timeout=CHEAT_TIMEOUT)
    )
    ca = pki.load_certificate(workspace.certs / "ca.crt")
    pins = [
        pin_certificate(pki.load_certificate(workspace.certs / f"{name}.crt"), ca) for name in ("aggregator", *FOUR[:3])
    ]
    manifest = root / "manifest.toml"
    write_manifest(manifest, Roster("fedfair-launch", tuple(pins), 0, 3))
    return workspace, manifest


def twin_credentials(workspace: Workspace, name: str) -> TlsFiles:
    """A second certificate for `name`, minted by the CA holder with a key of its own."""
    folder = workspace.root / "twins"
    folder.mkdir(exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = pki.sign_request(
        pki.create_request(name, key),
        pki.load_certificate(workspace.certs / "ca.crt"),
        pki.load_private_key(workspace.certs / "ca.key"),
        "collaborator",
    )
    (folder / f"{name}.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    write_file(folder / f"{name}.key", pem, 0o600)
    return TlsFiles(workspace.certs / "ca.crt", folder / f"{name}.crt", folder / f"{name}.key")


@dataclass
class SybilOutcome:
    """What the institution did in one federation run: the rounds it put its input in, and what it said."""

    contributed: list[int]
    said: list[str]
    aggregator_error: str | None


def sybil_run(root: Path, variant: str) -> SybilOutcome:
    """One federation run around the institution `VIEWER`, which holds the agreed manifest.

    `variant` is "genuine" (the real institutions: the control), "sybils" (the operator's own
    parties beside it) or "twins" (the other institutions' names, with certificates the operator
    minted for keys of its own).
    """
    workspace, manifest_path = sybil_workspace(root)
    honest = dataclasses.replace(
        load_collaborator_config(workspace.configs[VIEWER]), manifest=load_manifest(manifest_path)
    )
    template = load_collaborator_config(workspace.configs["site-b"])
    plan = load_aggregator_plan(workspace.plan)
    if variant == "genuine":
        others = {name: load_collaborator_config(workspace.configs[name]) for name in FOUR[1:3]}
    elif variant == "twins":
        others = {
            name: dataclasses.replace(template, name=name, certificates=twin_credentials(workspace, name))
            for name in FOUR[1:3]
        }
    else:
        for name in SYBILS:
            pki.issue(workspace.certs, "collaborator", name)
        plan = load_aggregator_plan(workspace.plan, {"federation": {"collaborators": [VIEWER, *SYBILS]}})
        others = {
            name: dataclasses.replace(template, name=name, certificates=TlsFiles.in_folder(workspace.certs, name))
            for name in SYBILS
        }
    aggregator = PatchedAggregator(plan, lambda network: None)
    with collaborator_log(VIEWER) as said:
        group = HonestCollaborators.launch({VIEWER: honest, **others}, lambda name: trainer_factory(name, FixedTrainer))
        try:
            group.join(60)
        finally:
            group.stop()
            aggregator.stop()
    errors = [group.errors[VIEWER]] if VIEWER in group.errors else []
    return SybilOutcome(list(group.collaborators[VIEWER].contributed_rounds), [*said, *errors], aggregator.error)


def sybil_rows(root: Path, book: RowBook) -> None:
    """The control run with the genuine institutions, then the two Sybil rosters."""
    control = sybil_run(root / "genuine", "genuine")
    for variant, attack in (
        ("sybils", "Sybil roster: parties of the aggregator's own beside one institution"),
        ("twins", "Sybil roster: twins (CA-minted certificates for the other institutions' names)"),
    ):
        with book.row(
            attack,
            "the institution, holding the agreed manifest, refuses the round (roster or certificates not pinned) "
            "and never sends its masked input, while with the genuine institutions it does (the control)",
            PATCHED_AGGREGATOR,
        ) as row:
            outcome = sybil_run(root / variant, variant)
            refusals = [line for line in outcome.said if any(word in line for word in REFUSAL_WORDS)]
            refusal = (refusals or outcome.said or ["nothing logged"])[0][:300]
            if not control.contributed:
                row.record(
                    f"inconclusive: in the control run with the genuine institutions {VIEWER} contributed nothing "
                    f"either ({control.said[:2]}, aggregator: {control.aggregator_error})",
                    False,
                )
                continue
            row.record(
                f"{VIEWER} contributed to rounds {outcome.contributed or 'none'} (control: {control.contributed}); "
                f"what it said: {refusal}",
                not outcome.contributed,
                said=outcome.said[:5],
                aggregator_error=outcome.aggregator_error,
            )
