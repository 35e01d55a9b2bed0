"""[secure_aggregation] input_bound and auditor: the plan's declaration of the two-verifier input bound.

In that mode every party proves its update within its L2 bound (``update_norm`` times its weight) to two
verifiers: the aggregator and an auditor institution the manifest names (fedfair.secagg.bounded). Here: the
keys, the round kind the mode runs (:func:`input_bound_kind`: the plan's side of the bounded sum's plug-in), the
auditor's independence (neither the aggregator nor a collaborator), the line ``fedfair plan show``
prints, and the bounds the proof's field cannot hold (:func:`check_bounded_round`). A site may refuse the auditor by name
([collaborator] refuse_auditors).

Why: docs/security.md, "Bounded inputs (two verifiers)", "Declaring it".
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Iterable
from typing import Protocol

from fedfair.core.errors import ConfigError
from fedfair.core.tables import Table
from fedfair.pki.names import validate_name
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.layout import Layout, largest_dimension, squared_bound
from fedfair.secagg.bounded.stages import BOUNDED_ROUND

logger = logging.getLogger("fedfair.runtime")

NO_INPUT_BOUND = "none"
"""No input is proven within its bound (the default): under masking nobody checks a site's norm."""
TWO_VERIFIERS = "two_verifiers"
"""Every party proves its input within its bound to the aggregator and the plan's auditor."""
INPUT_BOUND_MODES = (NO_INPUT_BOUND, TWO_VERIFIERS)
"""The values of [secure_aggregation] input_bound."""


class InputBound(Protocol):
    """A [secure_aggregation] section's input-bound keys (learning_settings.SecureAggregationSettings)."""

    @property
    def input_bound(self) -> str:
        """One of :data:`INPUT_BOUND_MODES`."""

    @property
    def auditor(self) -> str | None:
        """The auditor institution's name, set exactly when input_bound is two_verifiers."""


def input_bound_kind(mode: str) -> str | None:
    """The name of the round kind a training round runs under input_bound `mode` (None: the bound names none).

    The bounded sum's under two verifiers; without a bound the plan's round_kind, else the default kind, runs.
    """
    return BOUNDED_ROUND.name if mode == TWO_VERIFIERS else None


def read_input_bound(table: Table, enabled: bool) -> tuple[str, str | None]:
    """The section's (input_bound, auditor), each checked against the other and against `enabled`.

    Raises:
        ConfigError: an unknown mode, the mode on without an auditor or without secure aggregation, or an
            auditor named with the mode off; each names the fix.
    """
    mode = table.string("input_bound", NO_INPUT_BOUND, choices=INPUT_BOUND_MODES)
    auditor = table.name("auditor", validate_name) if table.given("auditor") else None
    if mode == TWO_VERIFIERS and not enabled:
        table.fail(
            f'[secure_aggregation] input_bound = "{TWO_VERIFIERS}" proves masked inputs within their bounds, but '
            'enabled = false sends them in the clear; turn enabled back on or set input_bound = "none"'
        )
    if mode == TWO_VERIFIERS and auditor is None:
        table.fail(
            f'[secure_aggregation] input_bound = "{TWO_VERIFIERS}" needs its second verifier: add auditor = '
            '"NAME", an auditor institution of the manifest (role "auditor"), or set input_bound = "none"'
        )
    if mode == NO_INPUT_BOUND and auditor is not None:
        table.fail(
            f'[secure_aggregation] auditor = "{auditor}" is named but input_bound is "none", so nothing would '
            f'ask it to verify; set input_bound = "{TWO_VERIFIERS}" or remove auditor'
        )
    return mode, auditor


def check_auditor_independent(auditor: str | None, aggregator: str, collaborators: Collection[str], where: str) -> None:
    """The auditor is neither the aggregator nor a collaborator of the plan (see the module's docstring).

    Raises:
        ConfigError: naming which it is and the fix.
    """
    if auditor is None:
        return
    if auditor == aggregator:
        raise ConfigError(
            f"{where}: [secure_aggregation] auditor = {auditor!r} is the aggregator; the second verifier must be "
            "independent of it (together they hold both shares of every input): name another institution"
        )
    if auditor in collaborators:
        raise ConfigError(
            f"{where}: [secure_aggregation] auditor = {auditor!r} is a collaborator; a training site is one of "
            "those max_colluding lets collude with the aggregator, and with it the auditor reads every input: "
            "name an institution that does not train"
        )


def input_bound_line(secure: InputBound) -> str:
    """What ``fedfair plan show`` says of the input bound in force."""
    if secure.input_bound == NO_INPUT_BOUND:
        return (
            "input bound: none (no site proves its update within its bound; [secure_aggregation] input_bound = "
            f'"{TWO_VERIFIERS}" with an auditor declares it)'
        )
    return (
        f"input bound: two verifiers, the aggregator and auditor {secure.auditor!r}: every site proves its update "
        "within update_norm x its weight; they must not collude (together they hold every input)"
    )


def prepare_verification(secure: InputBound, party: str) -> None:
    """Under the two-verifier mode, compile the proof's arithmetic now (:func:`field.compile_kernels`), and say so.

    Every party of a bounded sum (each site, the aggregator, the auditor) calls this once it knows the plan and before
    its first round: compiled at first use instead, the first round waited as long as the slowest party compiled,
    with every party's log saying it waited for another. Nothing happens without the mode.
    """
    if secure.input_bound != TWO_VERIFIERS:
        return
    # Said before, too: the first time on a machine this is minutes of silence on a busy machine, after a line that
    # says the party is listening or joining.
    logger.info(
        "%s: compiling the bounded sum's arithmetic before the first round (the first time on this machine about "
        "20 s of one idle core, longer on a busy one; then loaded from numba's cache in seconds)",
        party,
    )
    started = time.perf_counter()
    field.compile_kernels()
    logger.info(
        "%s: the bounded sum's arithmetic is ready (compiled or loaded in %.1f s, before the first round)",
        party,
        time.perf_counter() - started,
    )


def bounded_check_lines(trained_noise: bool) -> list[str]:
    """What ``fedfair plan show`` says of the check a bounded training sum gets, in place of the masked round's.

    `trained_noise`: the plan adds training noise inside the sum ([privacy] mode = "distributed"), so a void round's
    inputs are not sent again. docs/security.md, "Bounded inputs (two verifiers)", "The verified total".
    """
    if trained_noise:
        leaver = "the next round applies without it (each round's inputs are trained afresh)"
    else:
        leaver = (
            "its input is in the total that was formed, so the next round on the same model waits once for it and "
            "is void naming it if it does not return: one that never returns keeps the model as it is for the rest "
            "of the federation, which ends in bounded time (exit 3) with that model"
        )
    return [
        "training sums: bounded sums, each checked by every accepted site's tags of its own share and the auditor's "
        "tags of its total; no site re-sums the shares, so the check is sound against the aggregator alone, not "
        "against a colluding site (the model still moves no further than the plan's sum bound)",
        f"a site that leaves after sharing and before its tags voids that round (the total cannot be checked "
        f"without them) unless its process, started again before DECIDE's deadline (which waits for it), answers "
        f"the verdict record from what it kept at SHARE; {leaver}; a site that refuses its verdict record (FORGED: "
        "one the aggregator tampered with) tags nothing and is such a leaver; a site lost after its tags costs no "
        "round",
        "a site whose proof fails is left out and named a liar by every site's own check of the verdict record; a "
        "site the aggregator's false verifier message leaves out shows it with the part it sent the aggregator, and "
        "every site refuses the round naming the aggregator (FRAMED); both verifiers sign their messages under the "
        "record's query seed, so a record with another seed is refused naming the aggregator (FORGED), and one the "
        "auditor's false message leaves out stops naming the auditor, but cannot show it without revealing its update",
        "evaluation sums: masked, as without the input bound",
    ]


def check_bounded_round(
    secure: InputBound,
    update_norm: float,
    weights: Iterable[float],
    fractional_bits: int,
    where: str,
    *,
    noised: bool = False,
    dimension: int = 1,
) -> None:
    """Refuse a plan in the two-verifier mode whose bounds the proof's field cannot hold at `dimension`.

    Each site's bound, update_norm times its weight at the round's `fractional_bits`, must fit: the plan's, or with
    `noised` (distributed DP) the noise's (:func:`~fedfair.runtime.plan.bounded_noise.bounded_fractional_bits`),
    which one record's sensitivity fixes. Training DP itself runs under the mode: each verifier adds the noise and
    each site charges it. `dimension` is the round's (an update's length): the range tests need 4 d T < p, so a
    bound that fits alone may not fit a large model; 1 holds the bound alone, where no model is built yet.

    Raises:
        ConfigError: naming the cause (the bound alone, or the dimension with the bound) and the fixes.
    """
    if secure.input_bound != TWO_VERIFIERS:
        return
    largest = max(weights, default=0.0)  # the largest weight gives the largest bound
    if largest <= 0 or _fits(update_norm, largest, fractional_bits, dimension):
        return
    fitting = largest_fractional_bits(update_norm, largest, fractional_bits - 1, dimension)
    bits = "the distributed noise's" if noised else "[secure_aggregation]"
    bound = f"a site's bound, [influence] update_norm {update_norm:g} x its weight {largest:g}"
    field_at = f"does not fit the bounded round's field at {bits} fractional_bits = {fractional_bits}"
    if _fits(update_norm, largest, fractional_bits, 1):  # the bound alone fits: the model's size is the cause
        bound_sq = squared_bound(update_norm, largest, fractional_bits)
        fewer_bits = "" if noised or fitting is None else f"lower fractional_bits to at most {fitting}, "
        raise ConfigError(
            f"{where}: {bound} (B^2 = 2^{math.log2(bound_sq):.1f}) {field_at} with the model's dimension "
            f"{dimension:,}: the range tests need 4 d T < p, so at most {largest_dimension(bound_sq):,} coordinates "
            f"fit at this bound (each fractional bit fewer doubles them); {fewer_bits}lower update_norm, or train a "
            "smaller model"
        )
    if noised or fitting is None:
        fix = (
            "lower update_norm (the noise's bits follow from one record's sensitivity)"
            if noised
            else "lower update_norm"
        )
    else:
        fix = f"lower fractional_bits to at most {fitting} or update_norm"
    raise ConfigError(
        f"{where}: {bound}, {field_at} (its squared bound must stay below about 2^43 in the encoded scale); {fix}"
    )


def largest_fractional_bits(update_norm: float, weight: float, at_most: int, dimension: int = 1) -> int | None:
    """The most fractional bits, up to `at_most`, at which the proof's field holds `update_norm` x `weight`.

    At `dimension` coordinates (1: the bound alone). None: not even at 0 bits.
    """
    return next((bits for bits in range(at_most, -1, -1) if _fits(update_norm, weight, bits, dimension)), None)


def largest_bound(dimension: int = 1) -> int:
    """The largest bound B (update_norm x weight in the encoded scale) whose square the proof's field holds.

    At `dimension` coordinates (1: the bound alone); 0 where none fits.
    """
    low, high = 0, 1 << 26  # B^2 = 2^52 is past p itself
    while high - low > 1:  # low fits (or is 0), high does not
        middle = (low + high) // 2
        low, high = (middle, high) if largest_dimension(middle * middle) >= dimension else (low, middle)
    return low


def soundness_line(update_norm: float, weight: float, fractional_bits: int, dimension: int) -> str:
    """What ``fedfair plan show`` says of the soundness a proof of `update_norm` x `weight` at `dimension` gets.

    docs/security.md, "Why the range tests, and soundness". Raises ConfigError where the field cannot hold it.
    """
    layout = Layout(dimension, squared_bound(update_norm, weight, fractional_bits))
    most = largest_bound(dimension) ** 2
    return (
        f"input bound soundness: {layout.tests} range tests a try, so an update above its bound passes a try with "
        f"probability at most 2^{math.log2(layout.soundness_error):.1f}; the largest site's squared bound B^2 = "
        f"2^{math.log2(layout.bound_sq):.1f} (encoded scale), the field's limit at d = {layout.dimension:,} "
        f"2^{math.log2(most):.1f}"
    )


def _fits(update_norm: float, weight: float, fractional_bits: int, dimension: int) -> bool:
    """Whether the proof's field holds a bound of `update_norm` x `weight` at `fractional_bits` and `dimension`."""
    try:
        Layout(dimension, squared_bound(update_norm, weight, fractional_bits))
    except ConfigError:
        return False
    return True
