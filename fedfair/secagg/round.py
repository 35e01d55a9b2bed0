"""A stage as a typed StageSpec, a kind of round as an ordered SecureRound registered by name.

As Flower's SecAgg+ workflow loops over a tuple of steps, whoever runs a round (the in-process
:func:`~fedfair.secagg.simulate.run_round`, the aggregator's driver, the collaborator's steps) loops over a
:class:`SecureRound`'s stages instead of writing them out, and takes every step through the one guard of its order
(:mod:`.round_order`): the state machines keep no order and do no I/O. A stage
(:class:`StageSpec`, generic over its party, server, input and upload) names its wire and report words, its parsers,
the party's step, the server's receive and close, and its size limits. Each kind of secure sum is a
:class:`SecureRound` registered by name (:func:`register_round_kind`), whose server keeps :class:`SecureSum`: the
masked round (:data:`fedfair.secagg.masked_round.SECURE_ROUND`) and the bounded one
(:data:`fedfair.secagg.bounded.stages.BOUNDED_ROUND`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, Protocol, TypeVar, cast, runtime_checkable

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ConfigError
from fedfair.pki.identity import CredentialVerifier
from fedfair.secagg.config import SecAggConfig, fallback_tag_set_bytes, rechecked_claim_bytes, resummed_claim_bytes
from fedfair.secagg.server import AggregateResult

VERDICT = b"accepted"
"""A survivor's upload in the last verifying stage: it verified the claimed sum (one that refuses it uploads
nothing and stops, :class:`~fedfair.core.errors.VerificationError`)."""

MESSAGE_OVERHEAD_BYTES = 64 << 10
"""Room for headers, keys, signatures and certificates around a stage's vector."""

PER_PARTY_STAGE_BYTES = 64 << 10
"""A stage's input per party of the roster: a signed advertisement with its certificate, or a share, a signature or
a name (each under 4 KiB in practice), with room to spare."""

BASE_STAGE_BYTES = 1 << 20
"""What a stage's input may hold beside its per-party part (the round's public parameters)."""


class SecureSum(Protocol):
    """What a runner needs of a secure sum's server beyond its stages' own steps.

    A second kind of secure sum keeps this interface, so the runners that loop over its stages need no change.
    """

    def finish(self) -> AggregateResult:
        """Close the last stage of the sum: the unmasked, decoded sum and who is in it."""

    @property
    def culprits(self) -> dict[int, str]:
        """Party -> why the server names it so far (also after an abort)."""

    @property
    def accusations(self) -> dict[int, tuple[int, ...]]:
        """Accused party -> its accusers."""

    def excluded(self) -> dict[int, str]:
        """The culprits the sum's outcome excludes from later rounds, with why (after a finish or an abort alike).

        The protocol's rule, under the sum's own security parameters: never more than :attr:`culprits`, and a
        party only accused by as many others as the collusion bound lets lie is not among them.
        """


@runtime_checkable
class Message(Protocol):
    """What travels as a stage's input or upload: it says its own bytes, as a transport carries them."""

    def to_bytes(self) -> bytes:
        """The message's bytes (what its stage's parser reads back)."""


@dataclass(frozen=True)
class RoundSetup:
    """What a runner knows of a round beside its :class:`SecAggConfig`; each kind of round takes what it needs.

    SECURE_ROUND's server takes `verify` alone; the bounded sum's parties take the rest too
    (:func:`fedfair.secagg.bounded.parameters.round_parameters`), and its server the aggregator's `identity_key`.

    verify: checks a party's relayed certificate (CA and manifest pins) and returns its identity key.
    session: the round's session id, which every signature of the bounded sum is bound to (b"": none).
    update_norm: the plan's L2 bound on an update per unit of weight.
    weights: roster name -> the plan's influence weight, for every party of the round.
    keys: name -> identity public key: every party of the round, the aggregator and the auditor.
    aggregator, auditor: their names ("" when the round has none).
    identity_key: this runner's own identity key where its server signs (the aggregator's), else None.
    public: the round's public parameters as the runner states them (the first stage's input); the bounded sum's
        server sends them to every site with the auditor's key.
    noise_mu: the Skellam parameter each verifier of the bounded sum adds to its total, from the plan (0: no DP).
    noise_secret: what the aggregator's noise keys derive from (its server's; b"" elsewhere).
    """

    verify: CredentialVerifier
    session: bytes = b""
    update_norm: float = 0.0
    weights: Mapping[str, float] = field(default_factory=dict)
    keys: Mapping[str, ec.EllipticCurvePublicKey] = field(default_factory=dict)
    aggregator: str = ""
    auditor: str = ""
    identity_key: ec.EllipticCurvePrivateKey | None = field(default=None, repr=False)
    public: bytes = b""
    noise_mu: float = 0.0
    noise_secret: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class PartyNames:
    """Party id <-> name in one round: the roster's parties, and the round's auditor (not a party of the roster).

    The auditor of a bounded sum uploads to the aggregator as one more peer, under its own party id, but is never
    one of the round's sites: it counts toward no quorum, no dropout and no survivor set.
    """

    config: SecAggConfig
    auditor: str = ""
    auditor_party: int | None = None

    def name_of(self, party: int) -> str:
        """The name of a party id: the auditor's, or the roster's."""
        if self.auditor_party is not None and party == self.auditor_party:
            return self.auditor
        return self.config.name_of(party)

    def party_id(self, name: str) -> int:
        """The party id of a name: the auditor's, or the roster's (a ConfigError for anyone else)."""
        if self.auditor_party is not None and name == self.auditor:
            return self.auditor_party
        return self.config.party_id(name)


@dataclass(frozen=True)
class Opening:
    """What the server's close of a stage hands the next: whom that stage addresses, and what each is sent.

    among: the parties the next stage expects an upload from (in increasing order).
    inputs: one message every party of `among` is sent, or each party's own (party -> message); None for
        the first stage, whose input is the runner's own (the aggregator: the round's public parameters).
    shared: where each party is sent its own, the part every one of them is sent alike, what a party that
        missed the round is kept (a re-checked claim without its inputs); None: nothing.
    """

    among: tuple[int, ...]
    inputs: Message | Mapping[int, Message] | None
    shared: Message | None = None

    def input_for(self, party: int) -> Message | None:
        """The message `party` is sent."""
        return self.inputs[party] if isinstance(self.inputs, Mapping) else self.inputs


class Uploaders(enum.Flag):
    """Who uploads in a stage: the round's parties, its second verifier (:attr:`SecureRound.auditor`), or both."""

    PARTIES = enum.auto()
    AUDITOR = enum.auto()


PartyT = TypeVar("PartyT")
"""The state machine of the party that takes a stage (a kind's client, or a second verifier)."""
ServerT = TypeVar("ServerT")
"""The kind's server."""
InputT = TypeVar("InputT")
"""What a party is sent in a stage (None in a round's first, whose input is the runner's own)."""
UploadT = TypeVar("UploadT")
"""What a party uploads in a stage (or, where it uploads a verdict, what its step returns)."""

_ServerIn = TypeVar("_ServerIn", contravariant=True)
"""The server a kind's stage hooks take (:class:`KindStage`)."""
_Server = TypeVar("_Server", bound=SecureSum)
"""A kind's server, as its declaration makes it (:class:`SecureRound`)."""

Own = Callable[[], np.ndarray]
"""A party's encoded input, asked for by the stage its contribution travels in (called once, there)."""


class StartsParty(Protocol):
    """How every runner starts a kind's party (:attr:`SecureRound.client`): mypy checks each kind's against it.

    As the kind's server is made from the round's config and the runner's :class:`RoundSetup`, so is each party,
    with its own identity: its roster name (or the round's auditor's), identity key and certificate (DER, for a kind
    whose parties relay their own). With `verified` it keeps its encoded input for the verifying stages (in process;
    a runtime's party reads it back from its own record). Returns its state, which the runner hands its steps.
    """

    def __call__(
        self,
        config: SecAggConfig,
        setup: RoundSetup,
        name: str,
        identity_key: ec.EllipticCurvePrivateKey,
        credential: bytes,
        /,
        *,
        verified: bool = False,
    ) -> object:
        """The party's state for one round of `config`: the runner hands it to the party's step of each stage."""


@dataclass(frozen=True)
class ServerHooks:
    """A stage's server hooks bound to one round's server (:meth:`StageSpec.hooks`); each None where it has none.

    receive: takes one upload, as the stage's :attr:`~StageSpec.upload` parsed it.
    close: closes the stage: the next stage's :class:`Opening`.
    ready: whether the server already has what the stage needs.
    withheld: why the stage's outcome must not be sent on (None: it may).
    """

    receive: Callable[[object], None] | None
    close: Callable[[], Opening] | None
    ready: Callable[[], bool] | None
    withheld: Callable[[], str | None] | None


class AnyStage(Protocol):
    """A stage of any kind as a runner that loops over a round's stages holds it: what the runner reads and calls.

    Each stage is typed where it is declared (:class:`StageSpec`, generic over its party, server, input and upload),
    and mypy checks there that its parsers, its party's step and its server's hooks fit one another and its kind's
    server (:class:`SecureRound`). A runner holds the stages of every kind in one tuple, so it sees their parsers'
    outcomes as `object` and calls the step and the server's hooks through :meth:`take_step` and :meth:`hooks`,
    handing each stage only its own kind's party and server and what its own parsers made.
    """

    @property
    def stage(self) -> enum.IntEnum:
        """Its member of its round's stage enum (:attr:`StageSpec.stage`)."""

    @property
    def wire(self) -> str:
        """Its name on the runtime's transport (:attr:`StageSpec.wire`)."""

    @property
    def noun(self) -> str:
        """What its uploads are, for the operator's progress line (:attr:`StageSpec.noun`)."""

    @property
    def evaluation_noun(self) -> str:
        """The same in an evaluation's sum (:attr:`StageSpec.evaluation_noun`)."""

    @property
    def received(self) -> Callable[[bytes | memoryview], object] | None:
        """Parses the stage's input (:attr:`StageSpec.received`)."""

    @property
    def upload(self) -> Callable[[bytes], object] | None:
        """Parses an upload; None where a party's upload is its verdict (:attr:`StageSpec.upload`)."""

    @property
    def upload_bytes(self) -> Callable[[SecAggConfig], int]:
        """The largest upload the stage takes (:attr:`StageSpec.upload_bytes`)."""

    @property
    def unready(self) -> str:
        """Why a party that never began the round cannot take the stage (:attr:`StageSpec.unready`)."""

    @property
    def uploaders(self) -> Uploaders:
        """Who uploads in the stage (:attr:`StageSpec.uploaders`)."""

    @property
    def repeatable(self) -> bool:
        """Whether a party may take the stage again (:attr:`StageSpec.repeatable`)."""

    @property
    def skippable(self) -> bool:
        """Whether a party may take the stages after it without it (:attr:`StageSpec.skippable`)."""

    @property
    def rejoinable(self) -> bool:
        """Whether a party's restarted process may take the stage (:attr:`StageSpec.rejoinable`)."""

    @property
    def words(self) -> str:
        """What a report calls the stage (:attr:`StageSpec.words`)."""

    @property
    def input_bytes(self) -> Callable[[int, int], int]:
        """The largest input a party reads for the stage (:attr:`StageSpec.input_bytes`)."""

    def take_step(self, party: object, received: object, own: Own) -> object:
        """The party's step (:meth:`StageSpec.take_step`)."""

    def hooks(self, server: SecureSum) -> ServerHooks:
        """The server's hooks bound to `server` (:meth:`StageSpec.hooks`)."""


@dataclass(frozen=True)
class StageSpec(Generic[PartyT, ServerT, InputT, UploadT]):
    """One stage of a secure round, typed by who takes it and what travels: everything a runner needs to run it.

    stage: its member of its round's stage enum (SECURE_ROUND: the header's :class:`Stage`, its messages' binding).
    wire: its name on the runtime's transport, less ``STAGE_`` and an evaluation's ``EVAL_`` (proto/fedfair.proto).
    noun: what its uploads are, for the operator's progress line ('masked inputs').
    evaluation_noun: the same in an evaluation's sum ('masked evaluation sums').
    received: parses the stage's input; None for the first stage, whose input is the runner's own.
    step: the party's step: step(party, the stage's input, its encoded input (:data:`Own`)) -> its upload.
    upload: parses an upload; None when a party's upload is its :data:`VERDICT`, not a message.
    receive: the server's step per upload (None with `upload` None).
    close: the server's close of the stage: the next stage's :class:`Opening` (None for the last stage of the
        sum, which :meth:`SecureSum.finish` closes, and for the round's last).
    upload_bytes: the largest upload the stage takes, for the round's config.
    unready: why a party that never began the round (it has no client) cannot take this stage.
    ready: whether the server already has what the stage needs, so it may close before every party answered.
    withheld: why an aggregator must not close the stage and send its outcome on (None: it may), checked just
        before :attr:`close`; it aborts the round instead. An in-process round sends it on regardless.
    uploaders: who uploads in the stage, so who a runtime admits there (:class:`Uploaders`).
    repeatable: a party may take the stage again once it took it (its step answers the same input the same way,
        and refuses another), so a server that asks twice gets the same answer.
    skippable: a party may take the stages after this one without it (a stage the server may close before every
        party answered: one it never asked takes part in the next all the same).
    rejoinable: a party whose process restarted after it took the stages before may take this stage, and the round's
        stages after it: what the party needs here it kept on disk before its last upload (the bounded sum's DECIDE:
        its settlement), and every party this stage addresses contributed already. A runtime hands a restarted
        party's new connection this stage while it is open, and waits for a party whose connection ended until the
        stage's deadline, as its return may still answer it.
    words: what a reader of a federation's report calls the stage ("": its wire name in lower case).
    input_bytes: the largest input a party reads for the stage, from the roster's size and the most words a sum
        of the aggregation may hold (:func:`roster_input` unless the input carries a sum).
    """

    stage: enum.IntEnum
    wire: str
    noun: str
    evaluation_noun: str
    received: Callable[[bytes | memoryview], InputT] | None
    step: Callable[[PartyT, InputT, Own], UploadT]
    upload: Callable[[bytes], UploadT] | None
    receive: Callable[[ServerT, UploadT], None] | None
    close: Callable[[ServerT], Opening] | None
    upload_bytes: Callable[[SecAggConfig], int]
    unready: str
    ready: Callable[[ServerT], bool] | None = None
    withheld: Callable[[ServerT], str | None] | None = None
    uploaders: Uploaders = Uploaders.PARTIES
    repeatable: bool = False
    skippable: bool = False
    rejoinable: bool = False
    words: str = ""
    input_bytes: Callable[[int, int], int] = field(default_factory=lambda: roster_input)

    def take_step(self, party: object, received: object, own: Own) -> object:
        """The party's :attr:`step`, as a runner that holds stages of every kind alike takes it.

        The runner hands it the party its kind made for the stage and what this stage's :attr:`received` parsed
        (in process: what its server's opening made for it). Its declaration checks the step against those types;
        a runner holding stages of any kind cannot, so here they are taken as declared (:class:`AnyStage`).
        """
        return self.step(cast(PartyT, party), cast(InputT, received), own)

    def hooks(self, server: SecureSum) -> ServerHooks:
        """The server's hooks of this stage bound to `server`, the one its kind made for the round (:class:`AnyStage`).

        Its uploads are received as this stage's :attr:`upload` parsed them.
        """
        kind_server = cast(ServerT, server)
        receive, close, ready, withheld = self.receive, self.close, self.ready, self.withheld
        return ServerHooks(
            None if receive is None else cast(Callable[[object], None], partial(receive, kind_server)),
            None if close is None else partial(close, kind_server),
            None if ready is None else partial(ready, kind_server),
            None if withheld is None else partial(withheld, kind_server),
        )


class KindStage(AnyStage, Protocol[_ServerIn]):
    """A stage as its kind declares it: one whose server's hooks take that kind's server (:class:`SecureRound`)."""

    @property
    def close(self) -> Callable[[_ServerIn], Opening] | None:
        """The server's close of the stage (:attr:`StageSpec.close`)."""


@dataclass(frozen=True, init=False)
class SecureRound:
    """A kind of secure sum: its stages in order and how its parties and its server are made.

    It is declared typed: mypy checks that every stage's server hooks and the kind's own take the server its
    `server` makes. A runner holds every kind alike, so here the kind's hooks take any :class:`SecureSum`; it hands
    them only the server the kind made for the round.

    sum_stages: the stages that make the sum; :meth:`SecureSum.finish` closes the last.
    verify_stages: the optional stages that verify it (verified aggregation).
    server: makes the server's state for a round from its config and the runner's :class:`RoundSetup` (each kind
        takes what it needs of it).
    client: makes a party's state for a round from what every runner that starts one hands it (:class:`StartsParty`:
        the round's config and setup, and the party's own identity), as `server` makes the server's.
    open_sum: opens the sum's first stage (the server): whom it addresses, with the runner's own input (the
        aggregator: the round's public parameters). SECURE_ROUND addresses every party; another kind may
        address one peer first (the bounded sum: its auditor).
    open_verification: opens the first verifying stage once the sum is finished (the server, its finish's result).
    contribution: the stage a party's contribution travels in (its step takes the encoded input): SECURE_ROUND's
        masked input, the bounded sum's shares.
    committed: the stage after whose upload the sum names a party's contribution, so the party is bound to it
        (SECURE_ROUND: its signature of the survivor set; the bounded sum: its check of the verdict record).
    auditor: the party id of a second verifier that uploads beside the parties (the bounded sum's), or None.
    binds_roster_at: the stage whose upload a party binds to the whole roster (the bounded sum's SHARE), so a round
        void from there on leaves its model to that roster; None: it binds the survivors the sum names (SECURE_ROUND).
    kept: the stage whose uploads the server keeps whole for the survivors to re-sum (SECURE_ROUND's masked inputs),
        which a runtime may keep in files; None: the server keeps none.
    evidence: what a finished sum's server signed for whom it names, which a runner keeps the digest of so a party
        can later show it (the bounded sum's verdict record); None: the kind has none.
    keeps_past_rounds: whether an aggregator keeps the inputs every party of an applied training round of this kind
        was sent alike, so a site that missed the round checks its sum afterwards and catches up (SECURE_ROUND:
        :func:`~fedfair.secagg.bystander.check_past_sum`; the bounded sum:
        :func:`~fedfair.secagg.bounded.bystander.check_past_total`); False: a site sits such a round out.
    """

    name: str
    sum_stages: tuple[AnyStage, ...]
    verify_stages: tuple[AnyStage, ...]
    server: Callable[[SecAggConfig, RoundSetup], SecureSum]
    client: StartsParty
    open_sum: Callable[[SecureSum], Opening]
    open_verification: Callable[[SecureSum, AggregateResult], Opening]
    contribution: enum.IntEnum
    committed: enum.IntEnum
    auditor: int | None
    binds_roster_at: enum.IntEnum | None
    kept: enum.IntEnum | None
    evidence: Callable[[SecureSum], bytes] | None
    keeps_past_rounds: bool

    def __init__(
        self,
        name: str,
        sum_stages: tuple[KindStage[_Server], ...],
        verify_stages: tuple[KindStage[_Server], ...],
        server: Callable[[SecAggConfig, RoundSetup], _Server],
        client: StartsParty,
        open_sum: Callable[[_Server], Opening],
        open_verification: Callable[[_Server, AggregateResult], Opening],
        contribution: enum.IntEnum,
        committed: enum.IntEnum,
        auditor: int | None = None,
        binds_roster_at: enum.IntEnum | None = None,
        kept: enum.IntEnum | None = None,
        evidence: Callable[[_Server], bytes] | None = None,
        keeps_past_rounds: bool = False,
    ) -> None:
        fields = {
            "name": name,
            "sum_stages": sum_stages,
            "verify_stages": verify_stages,
            "server": server,
            "client": client,
            # Erased to SecureSum once the declaration's types fit: a runner hands them only the server `server` made.
            "open_sum": cast(Callable[[SecureSum], Opening], open_sum),
            "open_verification": cast(Callable[[SecureSum, AggregateResult], Opening], open_verification),
            "contribution": contribution,
            "committed": committed,
            "auditor": auditor,
            "binds_roster_at": binds_roster_at,
            "kept": kept,
            "evidence": cast(Callable[[SecureSum], bytes] | None, evidence),
            "keeps_past_rounds": keeps_past_rounds,
        }
        for attribute, value in fields.items():  # frozen: set as the dataclass's own __init__ would
            object.__setattr__(self, attribute, value)

    def stages(self, verified: bool) -> tuple[AnyStage, ...]:
        """The stages a round runs, in order: the sum's, and with `verified` the verifying ones."""
        return self.sum_stages + self.verify_stages if verified else self.sum_stages

    def taken_by(self, uploader: Uploaders, verified: bool = True) -> tuple[AnyStage, ...]:
        """The stages `uploader` takes, in order (:class:`~fedfair.secagg.round_order.PartyOrder` over them guards a party's or the auditor's)."""
        return tuple(spec for spec in self.stages(verified) if uploader in spec.uploaders)

    def spec(self, stage: enum.IntEnum) -> AnyStage:
        """The first of this round's stages bound to `stage`."""
        return next(spec for spec in self.stages(True) if spec.stage is stage)

    def names(self, config: SecAggConfig, setup: RoundSetup) -> PartyNames:
        """Party id <-> name in a round of `config`: the roster's, and this round's auditor under its id."""
        if self.auditor is None:
            return PartyNames(config)
        if not setup.auditor:
            raise ConfigError(f"a {self.name} round has an auditor: name it in the round's setup (the plan's auditor)")
        return PartyNames(config, setup.auditor, self.auditor)


ROUND_KINDS: dict[str, SecureRound] = {}
"""Every kind of secure round by its name, as each registers itself (:func:`register_round_kind`)."""

_DEFAULT: list[str] = []
"""The name of the kind a runner takes where nothing names one (:func:`default_round_kind`), once registered."""


def register_round_kind(kind: SecureRound, *, default: bool = False) -> SecureRound:
    """Plug a kind of secure round in, as Opacus registers its accountants: its runners and reports find it by name.

    Returns `kind`, so a declaration registers itself where it is made. With `default`, it is the kind a runner
    takes where nothing names one (:func:`default_round_kind`: a plan's training round without a kind of its own,
    every evaluation); one kind only may be.

    A kind may reuse another's stages (the masked round's, with a stage of its own): a wire name it shares must
    be said the same way (its words and nouns), since logs and reports read a stage's words by its name.

    Raises:
        ConfigError: another kind of that name is registered, one of `kind`'s wire names is another kind's for a
            stage said otherwise, or `default` where another kind is the default.
    """
    if default and _DEFAULT:
        raise ConfigError(f"the round kind {_DEFAULT[0]!r} is the default already: register {kind.name!r} without it")
    if kind.name in ROUND_KINDS:
        raise ConfigError(f"a round kind named {kind.name!r} is registered already: give {kind.name!r} another name")
    taken = {spec.wire: _said(spec) for known in ROUND_KINDS.values() for spec in known.stages(True)}
    clashes = sorted(spec.wire for spec in kind.stages(True) if taken.get(spec.wire, _said(spec)) != _said(spec))
    if clashes:
        raise ConfigError(f"the round kind {kind.name!r} names stages another kind names ({', '.join(clashes)})")
    ROUND_KINDS[kind.name] = kind
    if default:
        _DEFAULT.append(kind.name)
    return kind


def default_round_kind() -> SecureRound:
    """The kind a runner takes where nothing names one: the one registered as the default.

    Raises:
        ConfigError: no kind is registered as the default (import :mod:`fedfair.secagg.kinds`, which registers the
            built-in kinds).
    """
    if not _DEFAULT:
        raise ConfigError("no round kind is registered as the default: import fedfair.secagg.kinds first")
    return ROUND_KINDS[_DEFAULT[0]]


def round_kind(name: str) -> SecureRound:
    """The registered round kind named `name`.

    Raises:
        ConfigError: none of that name is registered, naming those that are and how a kind plugs in.
    """
    kind = ROUND_KINDS.get(name)
    if kind is None:
        known = ", ".join(sorted(ROUND_KINDS))
        raise ConfigError(
            f"no round kind named {name!r} is registered (registered: {known}); name one of them, or import the "
            "module that registers yours (register_round_kind) in every party's process before the plan loads"
        )
    return kind


def _said(spec: AnyStage) -> tuple[str, str, str]:
    """How logs and reports say a stage: its words and nouns."""
    return spec.words, spec.noun, spec.evaluation_noun


def stage_words(wire: str) -> str:
    """What a reader of a report calls the stage of any registered kind named `wire` ("" for none with words)."""
    return next((spec.words for kind in ROUND_KINDS.values() for spec in kind.stages(True) if spec.wire == wire), "")


def roster_input(parties: int, _words: int) -> int:
    """The largest input of a stage that carries keys, shares, signatures or names: a fixed part and one per party."""
    return BASE_STAGE_BYTES + PER_PARTY_STAGE_BYTES * parties


def claim_input(parties: int, words: int) -> int:
    """The largest claimed sum: one word of at most 8 bytes each and the survivors' inputs it carries to re-sum or re-check."""
    return BASE_STAGE_BYTES + 8 * words + resummed_claim_bytes(parties, words) + rechecked_claim_bytes(parties, words)


def tag_set_input(parties: int, words: int) -> int:
    """The largest tag set: a tag per party, and above RESUMMED_WORDS in a round with a missing tag, inputs to re-sum."""
    return roster_input(parties, words) + fallback_tag_set_bytes(parties, words)


def small_upload(config: SecAggConfig) -> int:
    """The largest upload of a stage that carries keys, shares or signatures: a KiB per party, and overhead."""
    return MESSAGE_OVERHEAD_BYTES + 1024 * config.size


def vector_upload(config: SecAggConfig) -> int:
    """The largest masked input: the d + 1 encoded words, and overhead."""
    return (config.dimension + 1) * np.dtype(config.encoder.dtype).itemsize + MESSAGE_OVERHEAD_BYTES
