"""The collaborator's secure-aggregation steps of one aggregation (a training round or an evaluation).

Each upload stage has one step function, ``step(participant, work, inputs) -> payload``,
picked by the explicit table :data:`STEPS`:

- ADVERTISE: check the round's public parameters against this collaborator's copy of
  the plan (and withdraw if they differ), then advertise signed keys, with its mTLS
  private key as its identity key;
- SHARE: encrypted shares of its keys for the key directory's parties;
- MASKED_INPUT: the masked fixed-point vector (with secure aggregation off, the plain
  float64 vector after the same parameter check);
- UNMASK: the shares that let the aggregator remove the masks of the dropped.

A step raises :class:`RoundRefused` (or the protocol's own errors) to withdraw from
the rest of the round; the process (:mod:`fedfair.runtime.collaborator.client`) then
uploads the empty withdrawal instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey

from fedfair.core.errors import FedfairError
from fedfair.fairness import sums
from fedfair.pki.identity import CredentialVerifier
from fedfair.runtime.contract import EVALUATION, TRAINING, RoundParameters, Stages
from fedfair.runtime.plan import SharedSettings
from fedfair.runtime.transport import pb
from fedfair.secagg import Client, EncodingConfig
from fedfair.secagg.messages import KeyDirectory, ShareBundle, UnmaskRequest


class RoundRefused(FedfairError):
    """This collaborator does not take part in the rest of the round (it withdraws)."""


@dataclass
class Work:
    """What the collaborator contributes to one aggregation, and its secure-aggregation state."""

    round: int
    stages: Stages
    vector: np.ndarray | None
    weight: float
    client: Client | None = None
    withdrawn: bool = False
    encoded: np.ndarray | None = None
    """The fixed-point encoding of (vector, weight), made while the key stages run."""


@dataclass(frozen=True)
class Participant:
    """This collaborator as the aggregations know it: its identity and its copy of the plan."""

    name: str
    shared: SharedSettings
    parameters: int
    """The model's number of parameters: a training update is this long, plus c."""
    identity_key: EllipticCurvePrivateKey
    credential: bytes
    verify: CredentialVerifier

    def expected(self, stages: Stages) -> tuple[int, EncodingConfig]:
        """The vector length and encoding an aggregation of this kind must use."""
        if stages is EVALUATION:
            return sums.vector_length(), sums.ENCODING
        return self.parameters + 1, self.shared.secure_aggregation.encoding()

    def check_parameters(self, work: Work, inputs: bytes) -> RoundParameters:
        """The round's parameters, refused unless they are what this collaborator's plan implies."""
        parameters = RoundParameters.from_bytes(inputs)
        dimension, encoding = self.expected(work.stages)
        secure = self.shared.secure_aggregation
        problems = [
            what
            for what, wrong in (
                ("kind", parameters.kind != ("evaluate" if work.stages is EVALUATION else "train")),
                ("round", parameters.round != work.round),
                ("secure aggregation", parameters.secure != secure.enabled),
                ("roster", self.name not in parameters.parties),
                ("quorum", len(parameters.parties) < self.shared.quorum.min_collaborators),
                ("dimension", parameters.dimension != dimension),
                ("encoding", parameters.encoding != encoding),
                ("threshold", parameters.threshold != secure.threshold),
                ("neighbours", parameters.neighbours != secure.mask_neighbours),
            )
            if wrong
        ]
        if problems:
            raise RoundRefused(f"the round's parameters differ from the plan ({', '.join(problems)})")
        return parameters


def advertise(me: Participant, work: Work, inputs: bytes) -> bytes:
    parameters = me.check_parameters(work, inputs)
    config = parameters.secagg_config(me.shared.federation_id, work.stages)
    work.client = Client(config, me.name, me.identity_key, me.credential, me.verify)
    return work.client.advertise().to_bytes()


def share(me: Participant, work: Work, inputs: bytes) -> bytes:
    if work.client is None:
        raise RoundRefused("no keys were advertised this round")
    return work.client.share_keys(KeyDirectory.from_bytes(inputs)).to_bytes()


def masked(me: Participant, work: Work, inputs: bytes) -> bytes:
    assert work.vector is not None  # the process withdraws before any step when it has nothing
    if not me.shared.secure_aggregation.enabled:
        me.check_parameters(work, inputs)
        return np.append(work.vector, work.weight).astype("<f8").tobytes()
    if work.client is None:
        raise RoundRefused("no keys were shared this round")
    encoded = work.encoded if work.encoded is not None else work.client.config.encoder.encode(work.vector, work.weight)
    work.encoded = None  # masked in place: never reuse it
    return work.client.masked_input(ShareBundle.from_bytes(inputs), encoded).to_bytes()


def unmask(me: Participant, work: Work, inputs: bytes) -> bytes:
    if work.client is None:
        raise RoundRefused("no masked input was sent this round")
    return work.client.unmask(UnmaskRequest.from_bytes(inputs)).to_bytes()


Step = Callable[[Participant, Work, bytes], bytes]

STEPS: dict[pb.Stage, Step] = {
    TRAINING.advertise: advertise,
    TRAINING.share: share,
    TRAINING.masked: masked,
    TRAINING.unmask: unmask,
    EVALUATION.advertise: advertise,
    EVALUATION.share: share,
    EVALUATION.masked: masked,
    EVALUATION.unmask: unmask,
}
"""The step a collaborator runs at each upload stage of a training round and of an evaluation."""
