"""The models a site verified: each one the plan's server step applied to a sum this site verified.

Verified aggregation proves a round's sum (:mod:`fedfair.secagg.verify`); :class:`ModelChain` proves what the
aggregator did with it. Round 1's model must be the plan's initial model as this site builds it (the plan's seed
and architecture). Each verified sum is held to every bound the aggregator applies (:mod:`fedfair.core.sum_bounds`)
and stepped by the plan's server step; a later model is taken only if it is bit for bit the state so made (or, the
rounds since void, the one before). A model the site cannot check that way is neither trained on nor evaluated:
it sits the round out (:class:`UncheckedModelError`) and keeps its anchor, which outlives restarts
(:mod:`.chain_record`). A model it can check and that fails is refused (VerificationError). docs/security.md,
"Verified aggregation", says what is covered; large states live in files (:mod:`fedfair.runtime.state_files`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch

from fedfair.core.errors import AggregateError, UncheckedModelError, VerificationError, VerifyReason
from fedfair.core.server import Aggregate, ServerState
from fedfair.core.sum_bounds import DecodedSum, sum_breach
from fedfair.runtime.collaborator.chain_record import CHAIN_SUFFIX, Anchor, AnchorRecord, LoggedSum
from fedfair.runtime.contract import model_digest_of_parts, model_download
from fedfair.runtime.memory import release_freed
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.state_files import HeldState, keep, held_in_file, spans, stepped, tensors_of
from fedfair.secagg import Encoder
from fedfair.secagg.round import round_kind

logger = logging.getLogger("fedfair.collaborator")

_COMPARED = 1 << 20
"""Values of the output model narrowed and compared at a time (4 MiB of float32, 8 MiB of float64)."""

InitialModel = Callable[[], torch.Tensor]
"""This site's own build of the plan's initial model: its parameters, flat (the plan's seed and architecture)."""


class ModelChain:
    """The server state this site computed from the sums it verified, and the models it accepts from it.

    `folder` is the site's own, where it keeps its anchor (NAME.FEDERATION.chain.npz) and a state too large for
    memory (None: nothing kept across restarts, large states in the system's temporary folder). `initial` builds
    the plan's initial model as this site does (None: this site has none, so it checks no round 1).
    """

    def __init__(
        self, name: str, shared: SharedSettings, folder: Path | None = None, initial: InitialModel | None = None
    ) -> None:
        self._name = name
        self._shared = shared
        self._folder = folder
        self._initial = initial
        self._anchor: Anchor | None = None
        """The state whose model was sent for training round `anchor.round`, and what its verified sum makes."""
        self._record = (
            None if folder is None else AnchorRecord(folder / f"{name}.{shared.federation_id}.{CHAIN_SUFFIX}")
        )
        """The anchor kept on disk and the state files it names (None: nothing kept across restarts)."""
        self._loaded = folder is None
        """Whether the anchor kept on disk was read (once, at the first model)."""
        self.unchecked_from: int | None = None
        """The first round whose model this site sat out, unable to check it; None while it checked every one."""
        self._stranded = False
        """Whether a missed round ran on a model this chain did not make (:meth:`ran_on`): its anchor then stays, so
        no later catch-up can bridge to it either."""

    @property
    def active(self) -> bool:
        """Whether the plan verifies its training sums: only then is there a chain.

        Under secure aggregation whose training kind has verifying stages: the masked round's, or under a
        two-verifier input bound the bounded total each accepted site verifies (VERIFY). A kind without them (a
        plug-in's plain sum) leaves a site nothing to check a model against.
        """
        secure = self._shared.secure_aggregation
        return secure.enabled and bool(round_kind(secure.training_kind).verify_stages)

    @property
    def anchor(self) -> Anchor | None:
        """What this site checked last (its round's state, and what its verified sum makes), or None.

        After a restart, the anchor kept on disk, taken up at the first ask (its logged sums stepped again).
        """
        return self._held()

    @property
    def path(self) -> Path | None:
        """Where the anchor is kept across restarts (beside the config), or None."""
        return None if self._record is None else self._record.path

    def sent(self, round_number: int, theta: np.ndarray, c: float, control: np.ndarray | None) -> None:
        """Check the model (theta, c, sigma) sent for training round `round_number` before anything trains on it.

        Round 1's must be the plan's initial model, built here. A later round's must be the state this site
        made of the last sum it verified, or (the rounds since void) the state before; a round run again (the
        aggregator resumed) must be sent its model again. A site that holds no anchor (restarted before it verified
        any sum) takes a later round's model only if it is the plan's initial model (every round since void).

        Raises:
            VerificationError: INITIAL_MODEL, round 1's model is not the plan's initial model; NEXT_MODEL, this
                site verified the previous round's sum and the model is neither the server step applied to it nor
                (the round void) the model before; OUT_OF_BOUNDS, that sum broke the plan's bounds, so only the
                model before may follow, and another came.
            UncheckedModelError: this site has no state to check the model against: it sits the round out.
        """
        if not self.active:
            return
        anchor = self._held()
        if anchor is None or (round_number == 1 and anchor.round == 1):
            # Without an anchor (a restart before any verified sum) the plan's initial model is still checkable: every
            # round since round 1 was void, so the model is the one round 1 was sent.
            start = anchor.state if anchor is not None else self._start(round_number)
            if self._matches(start, theta, c, control):
                self._take(Anchor(round_number, start))
                return
            gap = self._gap(start, theta, c, control)
            if round_number > 1:
                self._unchecked(round_number, f"it holds no model it checked before this one, nor the initial ({gap})")
            raise VerificationError(
                round_number,
                VerifyReason.INITIAL_MODEL,
                "the model sent for round 1 is not the plan's initial model, which this site builds from the plan's "
                f"seed and architecture ({gap})",
            )
        if round_number < anchor.round:
            self._unchecked(round_number, f"it is at round {anchor.round}")
        # Run again: the model it ran on. Later: the step of its verified sum, or the rounds since void.
        candidates = [anchor.state] if anchor.next is None or round_number == anchor.round else [anchor.next]
        if round_number > anchor.round and anchor.next is not None:
            candidates.append(anchor.state)
        for candidate in candidates:
            if self._matches(candidate, theta, c, control):
                self._take(Anchor(round_number, candidate))
                return
        gap = self._gap(candidates[0], theta, c, control)
        if round_number == anchor.round:
            raise VerificationError(
                round_number,
                VerifyReason.NEXT_MODEL,
                f"round {round_number} is run again on another model than the one this site checked for it ({gap})",
            )
        if round_number == anchor.round + 1 and anchor.verified:
            raise self._refusal(round_number, anchor, gap)
        if anchor.verified:
            missed = f"{anchor.round + 1}" + ("" if round_number == anchor.round + 2 else f" to {round_number - 1}")
            why = f"it verified round {anchor.round}'s sum, and no sum of round {missed} since; the model is neither"
            why += " the step of that sum nor the one before"
        else:
            why = f"it did not verify round {anchor.round}'s sum, and the model is not the one before"
        self._unchecked(round_number, f"{why} ({gap})")

    def verified(self, round_number: int, words: np.ndarray, survivors: Collection[str], encoder: Encoder) -> None:
        """Apply the plan's server step to training round `round_number`'s verified sum (`words`, encoded).

        The sum is decoded as the aggregator decodes it, checked against every bound the aggregator applies, and
        divided by the weight the plan agrees for `survivors` (the aggregator's own rule). A sum that breaks a
        bound, or that the step refuses (AggregateError), makes no step: the round is void, as the aggregator's
        own checks void it. A state in a file is stepped a piece at a time, its sum decoded by piece where the
        encoding allows. The anchor is kept on disk before this returns (before the site's verdict leaves).
        """
        if self._checks(round_number):
            assert self._anchor is not None  # _checks found it
            by_slice = self._anchor.state.in_file
            decoded = self._decoded(words, len(survivors), encoder, by_slice)
            weight = self._agreed(survivors)
            logged = LoggedSum(round_number, words, tuple(sorted(survivors)), weight, encoder.config, encoder.parties)
            self._step(decoded, encoder.config.clip, logged)

    def verified_fixed_point(
        self, round_number: int, total: np.ndarray, survivors: Collection[str], fractional_bits: int
    ) -> None:
        """Apply the plan's server step to training round `round_number`'s verified fixed-point total.

        `total` is a total this site verified in signed fixed point (integers, 2^f times the summed sites' weighted
        updates, f = `fractional_bits`; the input-bound kind's total is one), decoded as the aggregator decodes it:
        its weight the plan's total for `survivors` (the summed sites), each of whose stochastic rounding moved a
        coordinate by under 2^-f. Then as :meth:`verified`, which takes a sum in the masked encoding's words.
        """
        if not self._checks(round_number):
            return
        logged = LoggedSum(
            round_number, total, tuple(sorted(survivors)), self._agreed(survivors), fractional_bits=fractional_bits
        )
        self._step(_fixed_point(logged), self._shared.secure_aggregation.encoding().clip, logged)

    def missed(self, through: int) -> range:
        """The training rounds up to `through` whose sums this site did not verify since the last one it did.

        From the round its anchor holds, if it took that round's model but verified no sum of it (it was shown a
        false view, or withdrew), else from the round after; without an anchor (it verified no sum yet) from round 1,
        stepping from the plan's initial model as this site builds it. Empty without a chain, with neither, or once a
        missed round ran on a model this chain did not make (:meth:`ran_on`).
        """
        anchor = self._held()
        if not self.active or self._stranded or (anchor is None and self._initial is None):
            return range(0)
        first = 1 if anchor is None else anchor.round + 1 if anchor.verified else anchor.round
        return range(first, through + 1)

    def ran_on(self, round_number: int, model: str) -> HeldState | None:
        """The state missed training round `round_number` ran on, as this site's chain made it; None if none it made.

        `model` is the :func:`~fedfair.runtime.contract.model_digest` the round's parameters state, which entered
        the session every survivor signed: signed data, not the aggregator's word. The candidates are the state the
        chain made last (the step of its last verified sum) and, the rounds since void, the state before it (the
        anchor's round's state where it verified none of it; without an anchor, the plan's initial state). None:
        a round between applied that this site did not check (not kept), so it cannot bridge to this one.
        """
        assert round_number in self.missed(round_number)  # the caller's to ask
        state = self._made(round_number, model)
        self._stranded = state is None
        return state

    def taken_up(self, round_number: int, model: str) -> None:
        """Hold training round `round_number`'s model again, after a restart lost it, where this chain made it.

        A process restarted after its contribution left (a bounded round's SHARE) lost the anchor its check of the
        round's model made, which only memory holds until a sum steps it. `model` is the model digest of the round's
        parameters that this site checked against that model before its contribution left, kept with it: the state
        of that digest among :meth:`ran_on`'s candidates is the round's. Where none is, nothing is held, and no total
        of the round is stepped (as for a round whose model this site did not check).
        """
        if round_number not in self.missed(round_number):
            return
        state = self._made(round_number, model)
        if state is not None:
            self._take(Anchor(round_number, state))

    def _made(self, round_number: int, model: str) -> HeldState | None:
        """The state of model digest `model` among those round `round_number`, after the anchor's, may run on.

        The step of the anchor's verified sum, or the anchor's own state (the rounds since void); without an anchor, the
        plan's initial state.
        """
        anchor = self._held()
        if anchor is None:
            candidates = [self._start(round_number)]
        else:
            candidates = [anchor.state] if anchor.next is None or not anchor.verified else [anchor.next, anchor.state]
        return next((state for state in candidates if self._digest(state) == model), None)

    def caught_up(
        self, round_number: int, state: HeldState, words: np.ndarray, survivors: Collection[str], encoder: Encoder
    ) -> None:
        """Apply the plan's server step to missed training round `round_number`'s sum, which this site verified.

        `state` is the one the round ran on (:meth:`ran_on`); `words` the sum this site checked as a bystander
        (:mod:`fedfair.secagg.bystander`): stepped as :meth:`verified` steps its own, and kept on disk likewise.
        """
        self._anchor = Anchor(round_number, state)
        self.verified(round_number, words, survivors, encoder)

    def caught_up_fixed_point(
        self, round_number: int, state: HeldState, total: np.ndarray, survivors: Collection[str], fractional_bits: int
    ) -> None:
        """Apply the plan's server step to missed round `round_number`'s fixed-point total, which this site verified.

        As :meth:`caught_up`: `total` is the one this site checked as a bystander (the input-bound kind's:
        :mod:`fedfair.secagg.bounded.bystander`), stepped as :meth:`verified_fixed_point` steps its own.
        """
        self._anchor = Anchor(round_number, state)
        self.verified_fixed_point(round_number, total, survivors, fractional_bits)

    def _checks(self, round_number: int) -> bool:
        """Whether this site checks training round `round_number`'s model: it holds that round's anchor."""
        anchor = self._anchor
        return self.active and anchor is not None and round_number == anchor.round

    def _agreed(self, survivors: Collection[str]) -> float:
        """The total weight the plan agrees for `survivors`: what the server step divides their sum by."""
        return self._shared.influence.total_weight(survivors, self._shared.batch_fraction)

    def _step(self, decoded: DecodedSum, clip: float, logged: LoggedSum) -> None:
        """The plan's server step applied to a verified sum (`logged`, `decoded`), held to every bound first.

        The aggregator applies the same bounds. The anchor is kept on disk, the sum logged in it.
        """
        anchor, round_number = self._anchor, logged.round
        assert anchor is not None  # _checks found it
        if self._record is not None:
            # The state before this one, which the record held until its next write, goes now, so that the
            # step's writes of as many values take the pages it frees while they are fresh: at d = 10^7 (4 tensors
            # in a file) they cost a site 0.28 CPU-s a round into pages freed earlier, 0.10 into these.
            self._record.let_go(anchor)
        state, shared = anchor.state, self._shared
        breach = sum_breach(
            decoded, clip, logged.weight, shared.influence.update_norm, state.dimension, sorted(logged.survivors)
        )
        if breach is not None:
            logger.warning(
                "%s: round %d: the sum this site verified breaks the plan's bounds (%s); it applies no step of it, "
                "and takes only the model before it next",
                self._name,
                round_number,
                breach,
            )
            self._take(Anchor(round_number, state, True, None, breach), keep=True)
            return
        try:
            after = self._stepped(state, decoded, logged.weight)
        except AggregateError as error:
            self._take(Anchor(round_number, state, True, None, str(error)), keep=True)
            return
        self._take(Anchor(round_number, state, True, after), keep=True, logged=logged)

    def _stepped(self, state: HeldState, decoded: DecodedSum, weight: float) -> HeldState:
        """The plan's server step applied to `state` and a sum (`decoded`) of total weight `weight`.

        Raises:
            AggregateError: the step refuses the sum (the round is void).
        """
        if state.in_file:
            # Before this site's pass over its state, the round's freed buffers go back to the system: at this
            # size they are worth the faults of taking them again (fedfair.runtime.memory). Called before the
            # bounds' passes over the sum instead, a call took 0.49 CPU-s, not 0.33-0.35, at d = 10^7 (round_compare).
            release_freed()
        algorithm, average_from = self._shared.algorithm(), self._shared.training.average_from_round

        def server_step(piece: ServerState, aggregate: Aggregate, consume: bool) -> ServerState:
            return algorithm.server_apply(piece, aggregate, average_from=average_from, consume=consume)

        # The state the site verified is kept beside the next (a void round goes back to it): never given up.
        return stepped(state, decoded.read, weight, server_step, give_up=False, folder=self._folder)

    def replayed(self, state: HeldState, logged: LoggedSum) -> HeldState:
        """The state the server step made of `state` and the sum `logged` when this site verified it, made again.

        Bit for bit the same (:class:`~fedfair.runtime.collaborator.chain_record.AnchorRecord` says why): how a
        restart takes up the states its anchor logs. The sum's bounds held when it was verified; they are not
        checked again.
        """
        if logged.encoding is None:
            decoded = _fixed_point(logged)
        else:
            encoder = Encoder(logged.encoding, logged.parties)
            decoded = self._decoded(logged.values, len(logged.survivors), encoder, state.in_file)
        return self._stepped(state, decoded, logged.weight)

    def evaluated(self, round_number: int, theta: np.ndarray, c: float) -> None:
        """Check the output model (theta-bar, c-bar) sent for round `round_number`'s evaluation.

        A round later than the last one this site checked (the rounds since void before it was sent their model)
        is evaluated only on a model it made: the average of its anchor's state, or of the step of its verified sum.

        Raises:
            VerificationError: NEXT_MODEL, this site verified round `round_number`'s sum and the model is not the
                average of the state after it (or, the round void, before it).
            UncheckedModelError: this site did not verify round `round_number`'s sum, or checked no model of it or
                since, and the model is none it made: it sits the evaluation out.
        """
        if not self.active:
            return
        anchor = self._held()
        if anchor is None or anchor.round > round_number:
            at = "no round" if anchor is None else f"round {anchor.round}"
            self._unchecked(round_number, f"it last checked the model of {at}, not of training round {round_number}")
        candidates = [anchor.state] if anchor.next is None else [anchor.next, anchor.state]
        for candidate in candidates:
            if c == candidate.c_average and self._downloaded(candidate, "theta_average", theta, narrowed=True):
                return
        if anchor.round < round_number:
            self._unchecked(
                round_number,
                f"it last checked the model of round {anchor.round}, not of training round {round_number}, and the "
                "output model is the average of none it made",
            )
        if not anchor.verified:
            self._unchecked(round_number, f"it did not verify round {round_number}'s sum")
        raise VerificationError(
            round_number,
            VerifyReason.NEXT_MODEL,
            f"the output model sent to evaluate in round {round_number} is not the average of the models the "
            "plan's server step makes of the sums this site verified",
        )

    # ------------------------------------------------------------ the anchor

    def _held(self) -> Anchor | None:
        """The anchor: in memory, or (the first time, after a restart) as kept on disk."""
        if not self._loaded:
            self._loaded = True
            record = self._record
            if record is not None and record.path.exists():
                try:
                    self._anchor = record.read(self._folder, self.replayed)
                except (OSError, ValueError, AggregateError) as error:
                    logger.warning(
                        "%s: the model chain's record %s is unreadable (%s); this site checks no model until it "
                        "is sent round 1's again, so it sits out the rounds it cannot check",
                        self._name,
                        record.path,
                        error,
                    )
        return self._anchor

    def _take(self, anchor: Anchor, *, keep: bool = False, logged: LoggedSum | None = None) -> None:
        """Hold `anchor`; with `keep`, keep it on disk first (a verified sum: what a restart must not lose).

        `logged` is the sum whose step is its next state, logged in it.
        """
        if keep and self._record is not None:
            self._record.write(anchor, logged)
        self._anchor = anchor

    def _unchecked(self, round_number: int, why: str) -> NoReturn:
        """Sit round `round_number` out: this site cannot check its model (its anchor stays)."""
        if self.unchecked_from is None:
            self.unchecked_from = round_number
        raise UncheckedModelError(round_number, why)

    def _refusal(self, round_number: int, anchor: Anchor, gap: str) -> VerificationError:
        """The refusal of the model sent for `round_number`, the round after `anchor`'s verified sum."""
        if anchor.void:
            return VerificationError(
                round_number,
                VerifyReason.OUT_OF_BOUNDS,
                f"the sum of round {anchor.round} this site verified makes no model ({anchor.void}), so only the "
                f"model before it may follow, and the model sent for round {round_number} is another ({gap})",
            )
        return VerificationError(
            round_number,
            VerifyReason.NEXT_MODEL,
            f"the model sent for round {round_number} is neither the plan's server step applied to the sum of round "
            f"{anchor.round} this site verified nor the model before it ({gap})",
        )

    # ------------------------------------------------------------ states and models

    def _decoded(self, words: np.ndarray, summands: int, encoder: Encoder, by_slice: bool) -> DecodedSum:
        """The sum `words` decoded as the aggregator decodes it: `by_slice`, a slice at a time where the encoding allows.

        Whole, the sum is decoded once for the bounds' pass and the step's; by slice (a state in a file, where a
        float64 copy of the sum would be a model's worth more memory), once for each of them.
        """
        length = words.size - 1
        if not (by_slice and encoder.decodes_by_slice):
            whole = encoder.decode(words, summands)
            return DecodedSum.of(whole.weighted_sum, whole.total_weight, whole.error_bound, summands)
        # The weight alone: the last word after one zero word decodes as the whole sum's weight does.
        weight = encoder.decode(np.concatenate([np.zeros(1, words.dtype), words[-1:]]), summands).total_weight

        def read(start: int, stop: int) -> np.ndarray:
            return encoder.decode_slice(words, start, stop)

        return DecodedSum(read, length, weight, encoder.error_bound(summands), summands)

    def _start(self, round_number: int) -> HeldState:
        """Round 1's state: the server's initial one made of this site's own build of the plan's initial model."""
        if self._initial is None:
            self._unchecked(round_number, "it has no initial model of its own to check the model against")
        built = self._initial().detach().to("cpu")
        algorithm = self._shared.algorithm()
        in_file = held_in_file(built.numel(), tensors_of(algorithm))
        # Widened to float64 a piece at a time (server_init's own copy): a state in a file never has a float64 copy of
        # the model whole (80 MB at d = 10^7, beside the float32 build, in each site at once as round 1 starts).
        pieces = (
            (start, stop, algorithm.server_init(built[start:stop])) for start, stop in spans(built.numel(), in_file)
        )
        return keep(pieces, built.numel(), in_file, self._folder)

    def _matches(self, state: HeldState, theta: np.ndarray, c: float, control: np.ndarray | None) -> bool:
        """Whether (theta, c, control) is, bit for bit, what the aggregator sends of `state` (contract's downloads)."""
        if c != state.c or (control is None) == state.has("control"):
            return False
        if control is not None and not self._downloaded(state, "control", control, narrowed=False):
            return False
        builtin = self._shared.model.factory is None
        wire = np.dtype(np.float64) if control is not None else model_download(np.empty(0), builtin).dtype
        return theta.dtype == wire and self._downloaded(state, "theta", theta, narrowed=control is None)

    def _digest(self, state: HeldState) -> str:
        """:func:`~fedfair.runtime.contract.model_digest` of the training download the aggregator makes of `state`."""
        control = state.has("control")
        builtin = self._shared.model.factory is None

        def parts() -> Iterator[np.ndarray]:
            # As contract.training_download lays it out: theta (narrowed without drift correction), then sigma.
            for start, stop in state.spans():
                theta = state.values("theta", start, stop)
                yield theta.astype(np.float64, copy=False) if control else model_download(theta, builtin)
            if control:
                for start, stop in state.spans(state.dimension + 1):
                    yield state.values("control", start, stop).astype(np.float64, copy=False)

        return model_digest_of_parts(parts(), state.c)

    def _downloaded(self, state: HeldState, field: str, sent: np.ndarray, *, narrowed: bool) -> bool:
        """Whether `sent` is, bit for bit, `state`'s tensor `field` as a download carries it (`narrowed`: model_download's).

        Narrowed and compared a slice at a time: a float32 copy of the whole costs a model's worth.
        """
        length = state.dimension + (1 if field == "control" else 0)
        if sent.size != length:
            return False
        builtin = self._shared.model.factory is None
        for start, stop in state.spans(length):
            values = state.values(field, start, stop)
            for at in range(0, values.size, _COMPARED):
                expected = values[at : at + _COMPARED]
                if narrowed:
                    expected = model_download(expected, builtin)
                # Bit for bit, dtype and zero signs included: equal by value would leave the aggregator a choice
                # no comparison sees (a zero's sign, a wider copy), and a download is exactly what it must send.
                if not _same_bits(sent[start + at : start + at + expected.size], expected):
                    return False
        return True

    def _gap(self, state: HeldState, theta: np.ndarray, c: float, control: np.ndarray | None) -> str:
        """How far (theta, c, control) is from `state`'s model: the refusal's figures."""
        if state.dimension != theta.size:
            return f"{theta.size} values where the step makes {state.dimension}"
        if (control is None) == state.has("control"):
            return "a control variate where the plan has none" if control is not None else "no control variate"
        differ, largest = 0, 0.0
        for start, stop in state.spans():
            expected, part = state.values("theta", start, stop), theta[start:stop]
            narrowed = expected.astype(theta.dtype)
            differ += int(np.count_nonzero((narrowed != part) | (np.signbit(narrowed) != np.signbit(part))))
            largest = max(largest, float(np.abs(expected - part).max(initial=0.0)))
        said = f"{differ} of {theta.size} values differ, the largest by {largest:.3g}; c by {abs(c - state.c):.3g}"
        if control is not None and not self._downloaded(state, "control", control, narrowed=False):
            said += "; the control variate differs"
        return said


def _same_bits(sent: np.ndarray, expected: np.ndarray) -> bool:
    """Whether `sent` is `expected` bit for bit: dtype, zero signs and NaN payloads included.

    Compared as unsigned integers of the values' width, in place: bytes objects of both (``tobytes``) were two
    copies of every slice, 0.6 ms of a site's model check a call at d = 10^6.
    """
    if sent.dtype != expected.dtype or sent.shape != expected.shape:
        return False
    bits = np.dtype(f"u{expected.dtype.itemsize}")
    return bool(np.array_equal(sent.view(bits), expected.view(bits)))


def _fixed_point(logged: LoggedSum) -> DecodedSum:
    """A verified signed fixed-point total (`logged`, without a masked encoding) decoded as the aggregator decodes it.

    As the input-bound kind's server does (:meth:`~fedfair.secagg.bounded.server.BoundedServer.finish`): its weight
    the plan's total for the summed sites, each of whose stochastic rounding moved a coordinate by under 2^-f.
    """
    summands, bits = len(logged.survivors), logged.fractional_bits
    values = np.ldexp(logged.values.astype(np.float64), -bits)
    return DecodedSum.of(values, logged.weight, summands * 2.0**-bits, summands)
