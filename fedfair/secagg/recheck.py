"""The re-check: above RESUMMED_WORDS, ``max_colluding + 1`` survivors recompute each survivor's challenge value.

Survivor j's masked input less its own masks is z_j; the z_j sum to S' modulo 2^k, and over the integers to
S' + 2^k K for the carries K the server claims beside S' (:func:`carried_sum`), both fixed before the challenge r.
Each survivor is sent the masked inputs of the peers it checks (:func:`checked_peers`), holds them to its signed
view and the committed secrets, and reports <r, z_j> in its signed tag (:func:`peer_values`). Every survivor accepts
S' only if each survivor's checkers agree and the values sum to <r, S'> + 2^k <r, K> (:func:`check_reports`). One
checker of each survivor is honest, so the values are the true ones and S' is the sum the re-sum
(:mod:`fedfair.secagg.resum`) would accept, but with probability 2^-126 per claim tried, at max_colluding + 1
inputs a party instead of n. The argument is in docs/security.md, "Verified aggregation".
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from fedfair.core.errors import VerificationError, VerifyReason
from fedfair.secagg import prg
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.messages import AdvertiseKeys
from fedfair.secagg.recovery import Secrets, survivor_masks
from fedfair.secagg.verify import CHECKS, TAG_MODULUS, Challenge, decode_tags, encode_tags

CARRY_DTYPE = np.dtype("<u2")
"""The carries travel as 16-bit two's-complement words: |K_j| < n, so up to 2^15 - 1 survivors."""

MOST_SURVIVORS = (1 << 15) - 1
"""The most survivors whose carries 16-bit words hold."""


def checked_peers(survivors: Sequence[int], party: int, max_colluding: int) -> tuple[int, ...]:
    """The survivors ``party`` re-checks: the next ``max_colluding + 1`` after it in ``survivors``, cyclically.

    Every survivor is then checked by ``max_colluding + 1`` distinct others (every other survivor where there are
    fewer), a public function of U3 alone: whichever survivors the aggregator keeps, at most ``max_colluding``
    of a survivor's checkers collude, so one honest party checks it. A round keeps t >= max_colluding + 2
    survivors, so there are always enough.
    """
    count = min(max_colluding + 1, len(survivors) - 1)
    at = list(survivors).index(party)
    return tuple(survivors[(at + step) % len(survivors)] for step in range(1, count + 1))


def carried_sum(parts: Iterable[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of ``parts`` modulo 2^k, and the carries K with sum(parts) = sum + 2^k K over the integers.

    Words (of k = 16, 32 or 64 bits) are read as two's complement throughout. The carries are
    :data:`CARRY_DTYPE` words; ``parts`` is read one at a time, so the caller may make each one as it is asked.

    Raises:
        ValueError: no parts, or more than :data:`MOST_SURVIVORS`.
    """
    total: np.ndarray | None = None
    carries = np.zeros(0, dtype=np.int16)
    count = 0
    for part in parts:
        count += 1
        if count > MOST_SURVIVORS:
            raise ValueError(f"the carries of more than {MOST_SURVIVORS} parts do not fit in 16-bit words")
        if total is None:
            total = np.array(part, copy=True)
            carries = np.zeros(part.size, dtype=np.int16)
            continue
        signed = np.dtype(f"<i{part.dtype.itemsize}")
        before, added = total.view(signed), part.view(signed)
        wrapped = total + part
        after = wrapped.view(signed)
        # Two's-complement overflow: two non-negatives wrapped to a negative (carry +1), or two negatives to a
        # non-negative (carry -1); nothing else can leave [-2^(k-1), 2^(k-1)).
        carries += (before >= 0) & (added >= 0) & (after < 0)
        carries -= (before < 0) & (added < 0) & (after >= 0)
        total = wrapped
    if total is None:
        raise ValueError("a carried sum needs at least one part")
    return total, carries.view(CARRY_DTYPE)


def claimed_values(challenge: Challenge, vector: np.ndarray, carries: np.ndarray) -> tuple[int, ...]:
    """What the survivors' reported values must sum to, for each check: <r, S'> + 2^k <r, K>."""
    shift = vector.dtype.itemsize * 8
    return tuple(
        total + (carried << shift)
        for total, carried in zip(challenge.dots(vector), challenge.dots(carries), strict=True)
    )


def peer_values(
    challenge: Challenge,
    peers: Iterable[tuple[int, np.ndarray]],
    secrets: Secrets,
    *,
    session: bytes,
    config: SecAggConfig,
    survivors: Sequence[int],
    advertisements: Mapping[int, AdvertiseKeys],
) -> Iterator[tuple[int, tuple[int, ...]]]:
    """Each peer's <r^c, z_j>: its masked input (already held to the view) with its own masks taken off.

    ``peers`` is (survivor, masked input) in the order to report them; each is unmasked in a copy of its own and
    dropped before the next, so at most one unmasked input is held.
    """
    for peer, masked in peers:
        unmasked = np.array(masked, copy=True)
        prg.apply_masks(
            unmasked,
            survivor_masks(
                peer, secrets, session=session, config=config, masked=set(survivors), advertisements=advertisements
            ),
        )
        yield peer, challenge.dots(unmasked)
        del unmasked


def check_reports(
    reports: Mapping[int, Sequence[tuple[int, bytes]]],
    expected: tuple[int, ...],
    *,
    config: SecAggConfig,
    survivors: Sequence[int],
) -> None:
    """Refuse the claimed sum unless the survivors' reports agree and their values sum to ``expected``.

    ``reports`` maps every survivor to the (peer, values) its signed tag carried; ``expected`` is
    :func:`claimed_values` of the claim this party tagged.

    Raises:
        VerificationError: BAD_TAG where a survivor's report is missing or names other peers than
            :func:`checked_peers` gives it; FORGED where two checkers of a survivor report different values (one
            of them lied about its masked input), or where the values do not sum to ``expected`` (the sum, or its
            carries, are not those of the survivors' masked inputs).
    """
    round_number = config.round
    colluding = config.security.max_colluding
    values: dict[int, tuple[int, ...]] = {}
    for checker in survivors:
        report = reports.get(checker, ())
        wanted = checked_peers(survivors, checker, colluding)
        if tuple(peer for peer, _ in report) != wanted:
            raise VerificationError(
                round_number,
                VerifyReason.BAD_TAG,
                f"{config.name_of(checker)}'s tag does not report the re-checked values of exactly "
                f"{', '.join(map(config.name_of, wanted))}",
            )
        for peer, field in report:
            value = decode_tags(field)
            if values.setdefault(peer, value) != value:
                raise VerificationError(
                    round_number,
                    VerifyReason.FORGED,
                    f"the checkers of {config.name_of(peer)} found different values for its masked input: one was "
                    "shown another input or secret than the view and the commitments fix",
                )
    totals = [sum(value[check] for value in values.values()) for check in range(CHECKS)]
    if any((total - want) % TAG_MODULUS for total, want in zip(totals, expected, strict=True)):
        raise VerificationError(
            round_number,
            VerifyReason.FORGED,
            "the survivors' re-checked values do not sum to the claimed aggregate's: it is not the sum of the "
            "masked inputs the survivors signed, unmasked",
        )


def false_reports(
    reports: Mapping[int, Sequence[tuple[int, bytes]]],
    true_values: Mapping[int, tuple[int, ...]],
    *,
    config: SecAggConfig,
    survivors: Sequence[int],
) -> dict[int, str]:
    """Each checker whose signed report is false, with why: it names other peers, or a value other than the truth.

    ``reports`` maps each checker to the (peer, values) its signed tag carried, ``true_values`` each survivor to
    its true <r^c, z_j> (an aggregator that rebuilt every z_j computes them: :meth:`Server.refuse_false_reports
    <fedfair.secagg.server.Server.refuse_false_reports>`). Either fault alone makes every survivor refuse the
    claimed sum (:func:`check_reports`: BAD_TAG, FORGED).
    """
    colluding = config.security.max_colluding
    false: dict[int, str] = {}
    for checker, report in sorted(reports.items()):
        wanted = checked_peers(survivors, checker, colluding)
        if tuple(peer for peer, _ in report) != wanted:
            false[checker] = f"its signed tag reports other peers than {', '.join(map(config.name_of, wanted))}"
            continue
        wrong = [config.name_of(peer) for peer, field in report if field != encode_tags(true_values[peer])]
        if wrong:
            false[checker] = (
                f"its signed tag reports a re-checked value of {', '.join(wrong)} other than the true one, "
                "which the aggregator computed from the masked input and secrets every checker holds"
            )
    return false
