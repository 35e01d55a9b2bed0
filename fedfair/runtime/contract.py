"""The wire contract: what the aggregator and every collaborator agree on about one aggregation.

The stages of a training round and of an evaluation (each bound on the wire by its
aggregation and its step in its round kind's declaration), the secure-aggregation session
number each uses, and the public round parameters the aggregator announces and each
collaborator checks against its own copy of the plan, and the layout of a training
round's download under drift correction. Both sides import this module; neither imports
the other's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ConfigError, IdentityError
from fedfair.core.tables import parse_json_object
from fedfair.pki.identity import CredentialVerifier
from fedfair.pki.verification import pinned_credential_verifier
from fedfair.runtime.manifest import Manifest
from fedfair.runtime.plan.influence import InfluenceSettings
from fedfair.runtime.transport import EVALUATE, TRAIN, WireStage, encode_tensor, pb
from fedfair.runtime.transport.chunks import PlainValues
from fedfair.secagg import EncodingConfig, SecAggConfig, SecurityParameters
from fedfair.secagg import kinds as kinds  # registers the built-in round kinds, which a plan names
from fedfair.secagg.round import AnyStage, RoundSetup, SecureRound, VERDICT, default_round_kind, round_kind

if TYPE_CHECKING:
    from fedfair.runtime.plan.learning_settings import SecureAggregationSettings


@dataclass(frozen=True)
class Stages:
    """The wire stages of one kind of aggregation: its start, then one per stage of its secure round.

    The k-th stage of the round's declaration (:attr:`protocol`, verified: every stage of it) travels as
    (:attr:`start`, step k) (:class:`~fedfair.runtime.transport.WireStage`): the stages are named and numbered once,
    in the round kind's declaration, and a stage added there needs no schema edit. Logs, fault points and reports
    call it ``STAGE_<prefix><spec.wire>`` (:meth:`name`).
    """

    start: WireStage
    """The aggregation's start (step 0): its download."""
    kind: str
    """What the aggregation's public parameters call it ("train" or "evaluate")."""
    prefix: str
    """What its secure stages' names start with after ``STAGE_``: "" for training, "EVAL_" for evaluation."""
    session_offset: int
    protocol: SecureRound = field(default_factory=default_round_kind)
    """The secure round the aggregation runs, stage by stage (verified: every stage of it); the default kind unless
    the aggregation names one."""
    plain_values: PlainValues = field(default=np.dtype("<f8"))
    """How a plain (unmasked) upload's values travel without secure aggregation. A training update is the
    model-sized upload, and float32 halves it at a rounding of at most
    :func:`~fedfair.runtime.transport.chunks.plain_rounding`, which the aggregator adds to the sum's error bound; an
    evaluation's or the statistics' sums are a few hundred values whose counts and totals are stated exactly, so
    they keep float64."""
    specs: dict[WireStage, AnyStage] = field(init=False, repr=False, compare=False)
    """Each upload stage -> its specification, in the round's order."""

    def __post_init__(self) -> None:
        specs = {
            WireStage(self.start.aggregation, step): spec
            for step, spec in enumerate(self.protocol.stages(True), start=1)
        }
        object.__setattr__(self, "specs", specs)

    def wire(self, spec: AnyStage) -> WireStage:
        """The stage `spec` travels as in this kind of aggregation."""
        return next(stage for stage, known in self.specs.items() if known is spec)

    def name(self, stage: WireStage) -> str:
        """What logs, fault points and reports call `stage` of this aggregation ('STAGE_EVAL_MASKED_INPUT')."""
        spec = self.specs.get(stage)
        return str(stage) if spec is None else f"STAGE_{self.prefix}{spec.wire}"

    def noun(self, spec: AnyStage) -> str:
        """What the uploads of `spec` are in this kind of aggregation, for the operator's progress line."""
        return spec.evaluation_noun if self.prefix else spec.noun

    @property
    def uploads(self) -> tuple[WireStage, ...]:
        """The secure-aggregation stages, in order: those a collaborator uploads to."""
        return tuple(self.specs)

    @property
    def masked(self) -> WireStage:
        """The stage whose uploads are the contributions (:attr:`SecureRound.contribution`).

        Masked under secure aggregation, shared under the bounded sum, plain without secure aggregation.
        """
        return self.wire(self.protocol.spec(self.protocol.contribution))

    @property
    def committed(self) -> WireStage:
        """The stage after whose upload the sum names a party's contribution (:attr:`SecureRound.committed`).

        The survivors' signatures of the masked round, the sites' check of the bounded sum's verdict record.
        """
        return self.wire(self.protocol.spec(self.protocol.committed))

    @property
    def sum_end(self) -> WireStage:
        """The sum's last stage (the masked round's UNMASK, the bounded sum's DECIDE)."""
        return self.wire(self.protocol.sum_stages[-1])

    @property
    def claim(self) -> WireStage | None:
        """Verified aggregation: the first stage that verifies the sum (its input: the claimed sum); None without."""
        return self.wire(self.protocol.verify_stages[0]) if self.protocol.verify_stages else None

    def last(self, secure: bool) -> WireStage:
        """The aggregation's last stage: an abort is bound to it, so it comes after whatever a collaborator did."""
        return self.uploads[-1] if secure else self.sum_end


@dataclass(frozen=True)
class Aggregations:
    """The federation's aggregations, as its plan makes them: its training round's kind and its evaluations'.

    A runtime that meets a wire stage looks it up here (the training round's step k is its plan's kind's k-th
    stage), so every name, step and limit of a stage comes from its kind's declaration.
    """

    training: Stages
    evaluation: Stages

    def __iter__(self) -> Iterator[Stages]:
        return iter((self.training, self.evaluation))

    def of(self, stage: WireStage) -> Stages | None:
        """The aggregation `stage` belongs to (None for JOIN or an unknown one)."""
        return next((stages for stages in self if stages.start.aggregation == stage.aggregation), None)

    def spec(self, stage: WireStage) -> AnyStage | None:
        """The round kind's stage that `stage` names (None for a start, JOIN, or a step the kind has not)."""
        stages = self.of(stage)
        return None if stages is None else stages.specs.get(stage)

    def name(self, stage: WireStage) -> str:
        """What logs and fault points call `stage` ('STAGE_MASKED_INPUT', 'STAGE_EVALUATE')."""
        stages = self.of(stage)
        return str(stage) if stages is None else stages.name(stage)


def training_stages(secure: SecureAggregationSettings) -> Stages:
    """A training round's stages under the round kind a plan's secure aggregation names (its training kind).

    Raises:
        ConfigError: no round kind of that name is registered in this process.
    """
    return training_of(round_kind(secure.training_kind))


def aggregations(secure: SecureAggregationSettings) -> Aggregations:
    """The aggregations of a federation whose plan's secure aggregation is `secure`."""
    return Aggregations(training_stages(secure), EVALUATION)


@functools.cache
def training_of(protocol: SecureRound) -> Stages:
    """A training round's stages under `protocol`: one value per kind, so every part of a process holds the same."""
    return Stages(
        start=TRAIN, kind="train", prefix="", session_offset=0, protocol=protocol, plain_values=np.dtype("<f4")
    )


TRAINING = training_of(default_round_kind())
"""A training round under the default kind (every plan but one whose secure aggregation names another)."""
EVALUATION = Stages(start=EVALUATE, kind="evaluate", prefix="EVAL_", session_offset=1)
"""An evaluation: the default kind's stages in every mode (its sums are counts and losses, which no plan bounds)."""


ACCEPTED = VERDICT
"""A survivor's verdict in the last verifying stage: it verified the claimed sum (a site that refuses it uploads
nothing and stops, :class:`~fedfair.core.errors.VerificationError`)."""

STREAM_ACCEPTED = ("fedfair-stream", "accepted")
"""The initial metadata the aggregator sends on a task stream it took (this name's only live one), before
any task: the collaborator says it joined only on it, so a refused second process of a name never does."""


def training_download_size(parameters: int, corrects_drift: bool) -> int:
    """How many values a TRAIN download carries besides c: theta's d, and sigma's d + 1 with drift correction."""
    return 2 * parameters + 1 if corrects_drift else parameters


def model_download(theta: np.ndarray, builtin: bool) -> np.ndarray:
    """Theta as a model download carries it: an evaluation's theta-bar, a training round's without drift correction.

    Float32 for a built-in model (`builtin`: the plan's [model] names no factory), whose parameters are float32:
    a collaborator trains and evaluates float32(theta) whichever width arrives, so the narrower download changes
    no update and no answer, at half the bytes and half the collaborator's memory. A factory's model may hold
    float64, so its theta travels as the server keeps it, float64. A site's check that the output model is the
    average of the training models allows for the narrowing (`collaborator.trajectory.Trajectory.mismatch`).
    """
    return np.asarray(theta, dtype=np.float32 if builtin else np.float64)


def training_download(theta: np.ndarray, control: np.ndarray | None, builtin: bool) -> np.ndarray:
    """The values a TRAIN stage's model download carries besides c.

    Without drift correction, :func:`model_download`'s theta. With it, theta followed by the server's control
    variate sigma (d + 1 more), both float64: sigma is carried across rounds, never cast to the model.
    """
    if control is None:
        return model_download(theta, builtin)
    return np.concatenate([np.asarray(theta, dtype=np.float64), np.asarray(control, dtype=np.float64)])


def split_training_download(
    values: np.ndarray, parameters: int, corrects_drift: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """(theta, sigma) from a TRAIN download (sigma None without drift correction).

    A ConfigError when its length is not what a model of `parameters` numbers and this drift correction imply.
    """
    expected = training_download_size(parameters, corrects_drift)
    if values.size != expected:
        raise ConfigError(
            f"the round's model holds {values.size} values, but the plan's model has {parameters} parameters"
            + (" and drift correction adds its control variate's d + 1" if corrects_drift else "")
            + f" ({expected} in all); the aggregator may run another plan or version"
        )
    if not corrects_drift:
        return values, None
    return values[:parameters], values[parameters:]


def model_digest(theta: object, c: float) -> str:
    """SHA-256 (hex) of a model (theta, c) as it travels: its wire dtype, its little-endian bytes and c.

    The aggregator states it in the round's parameters and each collaborator computes it from its
    download, so both sides agree on it exactly when the same model was sent.
    """
    return model_digest_of_parts([theta], c)


def model_digest_of_parts(parts: Iterable[object], c: float) -> str:
    """:func:`model_digest` of the model whose values are `parts` laid end to end (all of one wire dtype).

    What a site computes of a state it holds a piece at a time, without a copy of the whole download.
    """
    digest, first = hashlib.sha256(), True
    for part in parts:
        dtype, data = encode_tensor(part)
        if first:
            digest.update(pb.DType.Name(dtype).encode())
            first = False
        digest.update(data)
    digest.update(struct.pack("<d", c))
    return digest.hexdigest()


def session_round(round_number: int, stages: Stages) -> int:
    """The secure-aggregation session of an aggregation: 2 r for training round r, 2 r + 1 for its evaluation."""
    return 2 * round_number + stages.session_offset


@dataclass(frozen=True)
class RoundParameters:
    """The public parameters of one aggregation, sent to every participant before it starts.

    Collaborators compare them with what their own copy of the plan implies and
    withdraw if they differ, so an aggregator cannot quietly lower the threshold or
    the collusion bound, widen the encoding or change the vector's length.
    """

    kind: str
    round: int
    secure: bool
    parties: tuple[str, ...]
    dimension: int
    encoding: EncodingConfig
    security: SecurityParameters
    """The plan's collusion bound, threshold and masking degree: on the wire as three top-level keys."""
    graph_roster: tuple[str, ...]
    """The names the masking graph is drawn over: the plan's whole roster, sorted."""
    graph_seed: str = ""
    """The masking graph's public seed (hex) under secure aggregation: a hash of the federation, the
    graph roster, the degree and the session, which each collaborator recomputes; "" in plain mode."""
    model: str = ""
    """:func:`model_digest` of the model every participant was sent ("" for the statistics aggregation).
    Each collaborator checks it against its own download, and it enters the secure-aggregation session
    (:attr:`SecAggConfig.context`), so no session completes between parties sent different models."""
    protocol: str = field(default_factory=lambda: default_round_kind().name)
    """The secure round the aggregation runs (:attr:`SecureRound.name`), which each collaborator's plan implies."""
    identities: tuple[tuple[str, str], ...] = ()
    """(name, certificate DER in hex) of every party of a round whose parties need each other's identity keys up
    front (the bounded sum: its sites, the aggregator, the auditor), sorted by name; () otherwise. Each receiver
    checks each against the CA and its manifest's pin (:func:`relayed_keys`)."""

    @property
    def session(self) -> bytes:
        """SHA-256 of these parameters' canonical bytes: the bounded sum's session, which binds all of them."""
        return hashlib.sha256(b"fedfair round parameters\x00" + self.to_bytes()).digest()

    def to_bytes(self) -> bytes:
        """Canonical JSON (sorted keys, no spaces; a noise rotation key in hex), as :meth:`from_bytes` reads."""
        document = asdict(self)
        document.update(document.pop("security"))  # threshold, neighbours, max_colluding: the keys peers read
        document["encoding"] = self.encoding.to_document()
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> RoundParameters:
        """Parse :meth:`to_bytes`'s JSON.

        Raises:
            ConfigError: `data` is malformed or misses a field (the aggregator may run another version).
        """
        fix = "the aggregator may run another version"
        document = parse_json_object(data, "the round's parameters", fix)  # a deep or 5,000-digit one too
        try:
            return cls(
                kind=str(document["kind"]),
                round=int(document["round"]),
                secure=bool(document["secure"]),
                parties=tuple(str(name) for name in document["parties"]),
                dimension=int(document["dimension"]),
                encoding=EncodingConfig.of_document(document["encoding"]),
                security=SecurityParameters(
                    max_colluding=int(document["max_colluding"]),
                    threshold=None if document["threshold"] is None else int(document["threshold"]),
                    neighbours=None if document["neighbours"] is None else int(document["neighbours"]),
                ),
                graph_roster=tuple(str(name) for name in document["graph_roster"]),
                graph_seed=str(document["graph_seed"]),
                model=str(document["model"]),
                protocol=str(document["protocol"]),
                identities=tuple((str(name), str(der)) for name, der in document["identities"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ConfigError(f"the round's parameters are malformed ({error}); {fix}") from None

    def implied_graph_seed(self, federation_id: str, stages: Stages) -> str:
        """The graph seed these parameters imply (hex): what the aggregator states and each collaborator checks."""
        return self.secagg_config(federation_id, stages).graph_seed.hex() if self.secure else ""

    def secagg_config(self, federation_id: str, stages: Stages) -> SecAggConfig:
        """The secure-aggregation session these parameters describe, for `federation_id` and this round's `stages`."""
        return SecAggConfig(
            federation_id=federation_id,
            round=session_round(self.round, stages),
            parties=self.parties,
            dimension=self.dimension,
            encoding=self.encoding,
            security=self.security,
            graph_roster=self.graph_roster,
            context=bytes.fromhex(self.model),
        )


def identities(certificates: Mapping[str, bytes]) -> tuple[tuple[str, str], ...]:
    """:attr:`RoundParameters.identities` of name -> certificate (DER): sorted by name, each in hex."""
    return tuple((name, certificates[name].hex()) for name in sorted(certificates))


def relayed_keys(
    parameters: RoundParameters, manifest: Manifest, ca_certificate: x509.Certificate
) -> dict[str, ec.EllipticCurvePublicKey]:
    """Name -> identity key of every certificate `parameters` relay, each checked against the CA and its pin.

    Each name's certificate must be the one `manifest` pins for it, issued by the CA for the role the manifest gives
    it (collaborator, aggregator, auditor), valid now and not revoked: an aggregator cannot slip in a key of its own.

    Raises:
        ConfigError: a certificate is malformed, or names someone the manifest does not list.
        IdentityError: a certificate is not the CA's for that name and role, or not the pinned one.
    """
    keys: dict[str, ec.EllipticCurvePublicKey] = {}
    for name, der in parameters.identities:
        pin = manifest.pin(name)
        if pin is None:
            raise ConfigError(f"the round relays a certificate for {name!r}, whom the manifest does not list")
        try:
            credential = bytes.fromhex(der)
        except ValueError:
            raise ConfigError(f"the round relays a malformed certificate for {name!r}") from None
        verify = pinned_credential_verifier(ca_certificate, {name: pin.sha256}, pin.role, manifest.revoked)
        try:
            keys[name] = verify(name, credential)
        except IdentityError as error:
            raise IdentityError(f"the round relays a certificate for {name!r} that does not check: {error}") from None
    return keys


def round_setup(
    parameters: RoundParameters,
    verify: CredentialVerifier,
    keys: Mapping[str, ec.EllipticCurvePublicKey],
    influence: InfluenceSettings,
    batch_fraction: float,
    *,
    aggregator: str,
    auditor: str | None,
    identity_key: ec.EllipticCurvePrivateKey | None = None,
    noise_mu: float = 0.0,
    noise_secret: bytes = b"",
) -> RoundSetup:
    """What a party of the round `parameters` describe knows beside its config, as every party derives it.

    The session is the parameters' digest; the bound is [influence] update_norm and each site's weight its plan
    weight (:meth:`InfluenceSettings.weight_of`); `keys` are the identity keys (:func:`relayed_keys`).
    `identity_key` and `noise_secret` are the aggregator's, for its server; None and b"" elsewhere. `noise_mu`: each
    verifier's noise, which every party derives from the plan (:func:`~fedfair.runtime.plan.bounded_noise.bounded_noise_mu`).
    """
    return RoundSetup(
        verify,
        session=parameters.session,
        update_norm=influence.update_norm,
        weights={name: influence.weight_of(name, batch_fraction) for name in parameters.parties},
        keys=dict(keys),
        aggregator=aggregator,
        auditor=auditor or "",
        identity_key=identity_key,
        public=parameters.to_bytes(),
        noise_mu=noise_mu,
        noise_secret=noise_secret,
    )
