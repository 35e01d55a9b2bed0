"""The aggregator's state for one secure-aggregation round, which the stages of :class:`~fedfair.secagg.server.Server` share.

What every stage reads or writes (the advertisements, the shares' dealings, the checks, the running sum, the
survivors' signatures, the revealed shares, the tags), and the check each stage's close makes: its quorum. The
round's order is its runner's (:class:`~fedfair.secagg.round.ServerOrder`). The stages themselves are in :mod:`fedfair.secagg.keys_server`,
:mod:`fedfair.secagg.masking_server` and :mod:`fedfair.secagg.verify_server`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import (
    ProtocolError,
    ThresholdError,
)
from fedfair.pki.identity import CredentialVerifier
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import Decoded
from fedfair.secagg.messages import (
    AdvertiseKeys,
    Dealing,
    ShareKeys,
    UnmaskRequest,
)
from fedfair.secagg.recovery import Recovery
from fedfair.secagg.shares import Kind
from fedfair.secagg.verify_messages import AggregateTag
from fedfair.secagg.wire import Header, Stage


@dataclass(frozen=True, eq=False)
class AggregateResult:
    """The outcome of a round.

    encoded_sum: the unmasked sum modulo 2^k (d + 1 words, the last one the weight).
    decoded: the float64 weighted sum, total weight and error bound.
    contributors: the parties whose inputs are in the sum (U3).
    dropped: per stage, the parties that went silent in it (never advertised, never
        shared, never checked their shares, never sent a masked input, never signed the
        survivor set, never answered the unmask request).
    culprits: party -> why the server names it: accused at CHECK (with the accusers), a
        revealed share that does not match its owner's dealing, or shares it dealt that do
        not rebuild its committed secret.
    accusations: accused party -> the parties that accused it at CHECK.
    """

    encoded_sum: np.ndarray
    decoded: Decoded
    contributors: tuple[int, ...]
    dropped: Mapping[Stage, tuple[int, ...]]
    culprits: Mapping[int, str]
    accusations: Mapping[int, tuple[int, ...]]


class ServerState:
    """The aggregator's state for one round, and the checks its stages share.

    verify_credential checks each advertisement's credential against the roster name, so a
    forged or swapped key is refused at the door (peers check again themselves).
    """

    def __init__(self, config: SecAggConfig, verify_credential: CredentialVerifier) -> None:
        self.config = config
        self._verify_credential = verify_credential
        self._session = b""
        self._advertisements: dict[int, AdvertiseKeys] = {}
        self._identities: dict[int, ec.EllipticCurvePublicKey] = {}
        self._share_messages: dict[int, ShareKeys] = {}
        self._dealings: dict[int, Dealing] = {}
        self._checks: dict[int, tuple[int, ...]] = {}
        self._accusations: dict[int, tuple[int, ...]] = {}
        self._masking: tuple[int, ...] = ()
        self._masked: set[int] = set()
        self._input_digests: dict[int, bytes] = {}
        self._inputs: dict[int, np.ndarray] = {}
        """Each survivor's masked input, kept where the survivors may re-sum them (see ``receive_masked_input``)."""
        self._secrets: dict[tuple[Kind, int], bytes] = {}
        """The secrets rebuilt at UNMASK (survivors' seeds, dropped parties' mask keys), shown with a re-summed claim."""
        self._sum = np.zeros(config.dimension + 1, dtype=config.encoder.dtype)
        self._survivors: tuple[int, ...] = ()
        self._signatures: dict[int, bytes] = {}
        self._request: UnmaskRequest | None = None
        self._needed: list[tuple[Kind, int]] = []
        self._recovery: Recovery | None = None
        """The shares revealed at UNMASK and what they rebuild (from the unmask request on)."""
        self._responders: set[int] = set()
        self._culprits: dict[int, list[str]] = {}
        self._proven: set[int] = set()
        self._digest = b""
        self._tags: dict[int, AggregateTag] = {}

    @property
    def session_id(self) -> bytes:
        """The session id, fixed by :meth:`key_directory` (empty before)."""
        return self._session

    @property
    def culprits(self) -> dict[int, str]:
        """Party -> why the server names it so far (also after an abort)."""
        return {party: "; ".join(reasons) for party, reasons in sorted(self._culprits.items())}

    @property
    def proven(self) -> frozenset[int]:
        """Culprits whose fault follows from what the server saw, not only from others' accusations.

        Proof is a share off the verified polynomial or a bad dealing; a party only accused by others
        cannot be told from a lying accuser, so it is not in this set.
        """
        return frozenset(self._proven)

    @property
    def accusations(self) -> dict[int, tuple[int, ...]]:
        """Accused party -> its accusers, once the CHECK stage is closed."""
        return dict(self._accusations)

    @property
    def survivors(self) -> tuple[int, ...]:
        """The survivors (U3, sorted party ids) once the masked inputs are in; empty before."""
        return self._survivors

    @property
    def running_sum(self) -> np.ndarray:
        """The sum of the masked inputs so far (d + 1 words modulo 2^k), unmasked in place by ``finish``, then claimed.

        The array itself, not a copy: a test or an attack that plays a cheating server alters it before ``finish``
        (a forged sum); an honest runner never needs it (``finish`` returns the sum).
        """
        return self._sum

    @property
    def _view_inputs(self) -> tuple[bytes, ...]:
        """The survivors' masked-input digests, in the survivors' order: the view's third part."""
        return tuple(self._input_digests[party] for party in self._survivors)

    def _recovering(self) -> Recovery:
        """The UNMASK stage's shares (the stage has begun: the unmask request built them)."""
        if self._recovery is None:
            raise ProtocolError("no unmask request was made; the UNMASK stage has not begun")
        return self._recovery

    def _name(self, party: int, reason: str) -> None:
        reasons = self._culprits.setdefault(party, [])
        if reason not in reasons:
            reasons.append(reason)

    def _require_quorum(self, count: int, what: str) -> None:
        if count < self.config.t:
            accused = f" (accused at CHECK: {dict(self._accusations)})" if self._accusations else ""
            raise ThresholdError(
                f"only {count} of {self.config.size} parties {what}, below the threshold {self.config.t}; "
                f"round aborted{accused}"
            )

    def _header(self, stage: Stage) -> Header:
        session = b"" if stage is Stage.ADVERTISE else self._session
        return Header(self.config.federation_id, self.config.round, stage, session)
