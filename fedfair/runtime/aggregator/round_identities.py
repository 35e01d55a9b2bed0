"""What the aggregator supplies a round whose parties need identity keys up front: the bounded sum's.

The masked round's parties relay their certificates as they advertise their keys; the bounded sum's do not, so the
round's public parameters carry every party's certificate (:attr:`~fedfair.runtime.contract.RoundParameters.identities`):
each site's and the auditor's as the aggregator admitted them, and its own. Every party checks each against the CA
and its manifest's pins before it trusts a key.

Why: docs/security.md, "Bounded inputs (two verifiers)".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair import pki
from fedfair.core.errors import ConfigError, RoundAbortedError
from fedfair.core.files import kept_secret
from fedfair.pki.identity import CredentialVerifier, public_key_from_certificate
from fedfair.runtime.contract import RoundParameters, Stages, identities, round_setup
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan
from fedfair.runtime.plan.bounded_noise import bounded_noise_mu
from fedfair.runtime.plan.influence import InfluenceSettings
from fedfair.runtime.transport import TlsFiles
from fedfair.runtime.transport.security import PeerAuthenticator
from fedfair.secagg.round import RoundSetup


NOISE_SECRET_NAME = "noise.secret"
"""The file, in the aggregator's output folder, of the secret its bounded rounds' noise keys derive from: kept there
rather than derived from its identity key, so a renewed key draws a round run again's noise as its first run did."""

_SECRET_FIX = (
    "it is written by the aggregator alone: restore it from the output folder's backup; a new one would noise a round "
    "run again afresh, and the auditor could average the two draws"
)


@dataclass(frozen=True)
class RoundIdentities:
    """The aggregator's identity and its peers' certificates, for a round whose parties need keys up front.

    name: the aggregator's name; auditor: the plan's auditor ([secure_aggregation] auditor).
    identity_key: the aggregator's identity key (its TLS key), which signs the bounded sum's verdict record.
    certificates: name -> certificate (DER) of each of the given names: the aggregator's own, and each peer's as
        it was admitted (a ConfigError for a name with none: a peer never connected).
    influence, batch_fraction: the plan's [influence] and batch fraction, which fix each site's weight and bound.
    noise_mu: dimension -> the auditor's noise (:func:`~fedfair.runtime.plan.bounded_noise.bounded_noise_mu`).
    noise_secret: what the aggregator's noise keys derive from (:data:`NOISE_SECRET_NAME` in its output folder).
    """

    name: str
    auditor: str
    identity_key: ec.EllipticCurvePrivateKey = field(repr=False)
    certificates: Callable[[Iterable[str]], Mapping[str, bytes]]
    influence: InfluenceSettings
    batch_fraction: float
    noise_mu: Callable[[int], float]
    noise_secret: bytes = field(repr=False)


def relayed_identities(
    held: RoundIdentities | None, stages: Stages, roster: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    """The certificates a round of `stages` over `roster` relays: none, unless its parties need keys up front.

    The bounded sum's do (its auditor's, every site's, the aggregator's).

    Raises:
        RoundAbortedError: the round needs them and this aggregator was given no identities.
    """
    if stages.protocol.auditor is None:
        return ()
    if held is None:
        raise RoundAbortedError(
            f"a {stages.protocol.name} round needs the aggregator's identity and its peers' certificates, "
            "which this aggregator was not given: run it from a plan that declares its input bound"
        )
    try:
        return identities(held.certificates((*roster, held.name, held.auditor)))
    except ConfigError as error:
        raise RoundAbortedError(f"the round cannot relay its parties' certificates: {error}") from None


def aggregator_identities(
    plan: AggregatorPlan, authenticators: Iterable[PeerAuthenticator | None]
) -> RoundIdentities | None:
    """What the aggregator of `plan` supplies its bounded rounds, or None where the plan bounds no input.

    Its own certificate and identity key are its TLS files; a peer's certificate is the one it was admitted with by
    whichever of `authenticators` admits its name (the sites', the auditor's;
    :meth:`~fedfair.runtime.transport.security.PeerAuthenticator.admitted`).
    """
    secure = plan.secure_aggregation
    if not secure.bounds_inputs or secure.auditor is None:
        return None
    files = TlsFiles.in_folder(plan.aggregator.certs, plan.aggregator.name)
    own = pki.load_certificate(files.cert).public_bytes(serialization.Encoding.DER)
    admitting = [authenticator for authenticator in authenticators if authenticator is not None]

    def admitted(name: str) -> bytes | None:
        return next((held.admitted(name) for held in admitting if name in held.allowed_names), None)

    def certificates(names: Iterable[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for name in names:
            certificate = own if name == plan.aggregator.name else admitted(name)
            if certificate is None:
                raise ConfigError(f"{name!r} has not connected with a certificate the manifest pins")
            found[name] = certificate
        return found

    return RoundIdentities(
        plan.aggregator.name,
        secure.auditor,
        pki.load_private_key(files.key),
        certificates,
        plan.influence,
        plan.batch_fraction,
        functools.partial(bounded_noise_mu, plan, len(plan.collaborators)),
        kept_secret(plan.aggregator.output / NOISE_SECRET_NAME, _SECRET_FIX),
    )


def aggregator_setup(
    held: RoundIdentities | None, verify: CredentialVerifier, parameters: RoundParameters, stages: Stages
) -> RoundSetup:
    """What the round's server and names take beside its config: `verify` alone, or the bounded sum's setup.

    The keys are those of the certificates the parameters relay, which the aggregator admitted their holders with.
    """
    if stages.protocol.auditor is None or held is None:
        return RoundSetup(verify)
    keys = {name: public_key_from_certificate(bytes.fromhex(der)) for name, der in parameters.identities}
    return round_setup(
        parameters,
        verify,
        keys,
        held.influence,
        held.batch_fraction,
        aggregator=held.name,
        auditor=held.auditor,
        identity_key=held.identity_key,
        noise_mu=held.noise_mu(parameters.dimension),
        noise_secret=held.noise_secret,
    )
