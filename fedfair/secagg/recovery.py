"""The masked round's unmasking at the server: secrets rebuilt and checked, masks stripped, the sum decoded.

The secrets rebuilt from the shares survivors reveal, checked against their commitments, the masks stripped from
the sum, and the decoded sum checked for what honest inputs allow.

:class:`Recovery` keeps the shares revealed for each secret the sum needs (a survivor's
self-mask seed, a dropped party's mask key), rebuilds each once t shares agree with the
owner's commitment, and, when some do not, names who provably lied: a responder whose share
does not match the commitment in its owner's signed dealing (which the server verified at SHARE),
or an owner whose dealt shares do not rebuild what it committed to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from operator import itemgetter


from fedfair.core.errors import ProtocolError, SumOutOfRangeError, ThresholdError
from fedfair.secagg import keys, prg, shamir
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import Decoded, EncodingConfig
from fedfair.secagg.messages import AdvertiseKeys, EncryptedShares, RevealedShare
from fedfair.secagg.payloads import seed_commitment
from fedfair.secagg.shares import SECRET_BYTES, SHARE_CHUNKS, Kind

Revealed = tuple[shamir.Share, RevealedShare]
"""A revealed share, parsed, with the message entry that carried it."""


class Recovery:
    """The shares revealed in one round's UNMASK stage, and what they rebuild.

    Built when the server asks for the shares: the round's session, every party's accepted
    advertisement and its dealing are then fixed. ``dealt`` maps each dealer to the share
    entries of its dealing, whose signature the server verified at SHARE: their commitments
    are what a revealed share is checked against.
    """

    def __init__(
        self,
        config: SecAggConfig,
        session: bytes,
        dealt: Mapping[int, Iterable[EncryptedShares]],
        advertisements: Mapping[int, AdvertiseKeys],
    ) -> None:
        self.config = config
        self._session = session
        self._dealt = dealt
        self._lines: dict[int, dict[int, EncryptedShares]] = {}
        """Owner -> holder -> the line of its dealing, indexed on first use (most rounds never need it)."""
        self._advertisements = advertisements
        self.revealed: dict[tuple[Kind, int], dict[int, Revealed]] = {}
        self._rebuilt: dict[tuple[Kind, int], tuple[bytes, tuple[shamir.Share, ...]]] = {}

    def add(self, responder: int, kind: Kind, parsed: Mapping[int, Revealed]) -> None:
        """Keep `responder`'s shares of `kind`, by owner (as :meth:`parse_revealed` checked them)."""
        for owner, revealed in parsed.items():
            self.revealed.setdefault((kind, owner), {})[responder] = revealed

    def commitment_check(self, kind: Kind, owner: int) -> Callable[[bytes], bool]:
        """Whether a candidate secret is the one ``owner`` committed to at ADVERTISE."""
        return partial(is_committed, self.config, kind, self._advertisements[owner])

    def rebuild(self, kind: Kind, owner: int) -> tuple[bytes, tuple[shamir.Share, ...]] | None:
        """The verified secret and the shares that rebuilt it, from the shares so far; None if not (yet) possible.

        First the t smallest x (the common case: every share is good); failing that, a bounded
        search over t-subsets of the shares that match their owner's dealing.
        """
        cached = self._rebuilt.get((kind, owner))
        if cached is not None:
            return cached
        received = self.revealed.get((kind, owner), {})
        t = self.config.t
        if len(received) < t:
            return None
        verify = self.commitment_check(kind, owner)
        found = shamir.find_verified([share for share, _ in received.values()], t, SECRET_BYTES, verify, max_subsets=1)
        if found is None:
            dealt = [share for responder, (share, _) in received.items() if self.was_dealt(kind, owner, responder)]
            found = shamir.find_verified(dealt, t, SECRET_BYTES, verify)
        if found is not None:
            self._rebuilt[kind, owner] = found
        return found

    def rebuild_all(
        self, needed: Sequence[tuple[Kind, int]]
    ) -> tuple[dict[tuple[Kind, int], bytes], set[tuple[Kind, int]]]:
        """Every ``needed`` secret that can be rebuilt and verified, and the ones whose shares need an audit.

        One batched reconstruction over all of them (:func:`~fedfair.secagg.shamir.rebuild_many`):
        a secret is taken when its candidate matches its commitment (or :meth:`rebuild` already
        verified it) and every share lies on its polynomial. Any other secret is suspect: it goes
        the per-secret way (:meth:`rebuild`'s subset search), and only suspects can need
        :meth:`audit`, since an audit finds nothing when every share is on the verified polynomial.
        """
        t = self.config.t
        groups = {
            key: list(map(itemgetter(0), self.revealed[key].values()))
            for key in needed
            if len(self.revealed.get(key, ())) >= t
        }
        batch = shamir.rebuild_many(groups, t, SECRET_BYTES)
        secrets: dict[tuple[Kind, int], bytes] = {}
        suspects: set[tuple[Kind, int]] = set()
        for key in needed:
            candidate = batch.get(key)
            if candidate is not None and candidate.consistent:
                if (
                    key not in self._rebuilt
                    and candidate.secret is not None
                    and self.commitment_check(*key)(candidate.secret)
                ):
                    self._rebuilt[key] = (candidate.secret, candidate.basis)
                if key in self._rebuilt:
                    secrets[key] = self._rebuilt[key][0]
                    continue
            suspects.add(key)
            rebuilt = self.rebuild(*key)
            if rebuilt is not None:
                secrets[key] = rebuilt[0]
        return secrets, suspects

    def audit(self, kind: Kind, owner: int) -> dict[int, str]:
        """Who provably misbehaved in the shares of one secret: party -> why.

        Nothing to say when every share lies on the polynomial of the verified secret.
        Otherwise a share that does not match its owner's dealing was altered by its responder,
        and dealt shares that disagree with each other or with the commitment were dealt wrong.
        """
        received = self.revealed.get((kind, owner), {})
        rebuilt = self._rebuilt.get((kind, owner))
        shares = [share for share, _ in received.values()]
        if rebuilt is not None and not shamir.off_polynomial(rebuilt[1], shares):
            return {}
        culprits: dict[int, str] = {}
        dealt: list[shamir.Share] = []
        for responder, (share, _) in sorted(received.items()):
            if self.was_dealt(kind, owner, responder):
                dealt.append(share)
            else:
                culprits[responder] = (
                    f"sent a bad unmask share for party {owner} (a share of its {kind.value} that party {owner} never "
                    "dealt: it does not match the dealer's signed dealing)"
                )
        t = self.config.t
        if len(dealt) >= t:
            basis = dealt[:t]
            secret = shamir.secret_at_zero(basis, SECRET_BYTES)
            if shamir.off_polynomial(basis, dealt):
                culprits[owner] = f"dealt signed shares of its {kind.value} that do not lie on one polynomial"
            elif secret is None or not self.commitment_check(kind, owner)(secret):
                culprits[owner] = (
                    f"dealt signed shares of its {kind.value} that rebuild another secret than it committed to"
                )
        return culprits

    def was_dealt(self, kind: Kind, owner: int, responder: int) -> bool:
        """Whether the share ``responder`` revealed is the one ``owner``'s signed dealing commits to.

        An owner's own share is its own word: it kept it, so it is dealt by definition, and
        a bad one is the owner's fault whichever role it lied in.
        """
        if responder == owner:
            return True
        if owner not in self._lines:
            self._lines[owner] = {entry.recipient: entry for entry in self._dealt.get(owner, ())}
        line = self._lines[owner].get(responder)
        if line is None:
            return False
        _, revealed = self.revealed[kind, owner][responder]
        committed = line.seed_commitment if kind is Kind.SEED else line.key_commitment
        return committed == kind.commitment(self._session, owner, responder, revealed.share)

    def failure(self, failed: list[tuple[Kind, int]], culprits: Mapping[int, str]) -> ProtocolError:
        """The error that voids the round when some secrets cannot be rebuilt, naming who is to blame."""
        t = self.config.t
        parts = []
        too_few = True
        for kind, owner in failed:
            received = self.revealed.get((kind, owner), {})
            good = sum(self.was_dealt(kind, owner, responder) for responder in received)
            parts.append(f"party {owner}'s {kind.value} ({len(received)} shares, {good} dealt by it)")
            too_few = too_few and good < t
        blamed = "; ".join(f"party {party} {reason}" for party, reason in culprits.items()) or "nobody provably"
        message = f"cannot rebuild and verify {', '.join(parts)} with threshold {t}; round aborted. Culprits: {blamed}"
        if too_few:
            return ThresholdError(f"too few valid shares, below the threshold: {message}")
        return ProtocolError(message)

    def parse_revealed(
        self, responder: int, revealed: tuple[RevealedShare, ...], owners: set[int]
    ) -> dict[int, Revealed]:
        """Check and parse one kind of revealed share; ``owners`` are the parties the request named."""
        parsed: dict[int, Revealed] = {}
        for entry in revealed:
            if entry.owner not in owners or entry.owner in parsed:
                raise ProtocolError(
                    f"party {responder} revealed an unrequested or repeated share of party {entry.owner}"
                )
            # holders_of builds a set each call: look in the owner's neighbours directly, once per share.
            if responder != entry.owner and responder not in self.config.graph[entry.owner]:
                raise ProtocolError(f"party {responder} cannot hold a share of party {entry.owner}")
            share = shamir.Share.from_bytes(entry.share)
            if share.x != responder:
                raise ProtocolError(f"party {responder} revealed a share with another party's x")
            if len(share.values) != SHARE_CHUNKS:
                raise ProtocolError(f"party {responder} revealed a share of the wrong length")
            parsed[entry.owner] = (share, entry)
        return parsed


def is_committed(config: SecAggConfig, kind: Kind, advertisement: AdvertiseKeys, secret: bytes) -> bool:
    """Whether ``secret`` is the one of ``kind`` that ``advertisement``'s sender committed to at ADVERTISE.

    A self-mask seed must match its signed seed commitment; a mask key (32 raw bytes) must be the private key of
    its advertised public key.
    """
    owner = advertisement.sender
    if kind is Kind.SEED:
        return seed_commitment(config.digest, owner, secret) == advertisement.seed_commitment
    if len(secret) != keys.KEY_BYTES:
        return False
    return keys.public_bytes(keys.load_private(secret)) == advertisement.mask_public_key


Secrets = Mapping[tuple[Kind, int], bytes]
"""Rebuilt secrets by (kind, owner): survivors' self-mask seeds and dropped parties' mask keys."""


def unmasking_streams(
    secrets: Secrets,
    *,
    session: bytes,
    config: SecAggConfig,
    masked: set[int],
    advertisements: Mapping[int, AdvertiseKeys],
) -> list[prg.Mask]:
    """Every keystream to subtract from the sum: each survivor's own (:func:`survivor_masks`)."""
    return [
        mask
        for survivor in sorted(masked)
        for mask in survivor_masks(
            survivor, secrets, session=session, config=config, masked=masked, advertisements=advertisements
        )
    ]


def survivor_masks(
    survivor: int,
    secrets: Secrets,
    *,
    session: bytes,
    config: SecAggConfig,
    masked: set[int],
    advertisements: Mapping[int, AdvertiseKeys],
) -> list[prg.Mask]:
    """The keystreams to subtract from ``survivor``'s masked input that do not cancel in the sum over ``masked``.

    That is its self mask, and the pairwise masks it added for the parties that dropped before masking (whose mask
    keys ``secrets`` holds). What is left is its input plus its pairwise masks with other survivors.
    """
    masks: list[prg.Mask] = []
    for (kind, owner), secret in secrets.items():
        if kind is Kind.SEED and owner == survivor:
            masks.append((keys.self_mask_key(secret, session, owner), -1))
        elif kind is Kind.MASK_KEY and survivor in config.graph[owner] and survivor in masked:
            pair_key = keys.pair_mask_key(
                keys.agree(keys.load_private(secret), advertisements[survivor].mask_public_key),
                session,
                owner,
                survivor,
            )
            # The survivor added the stream if its id is the smaller one; undo whichever it did.
            masks.append((pair_key, -1 if survivor < owner else 1))
    return masks


def check_range(decoded: Decoded, contributors: int, encoding: EncodingConfig) -> None:
    """Refuse a decoded sum no honest contributors could produce (a weight or coordinate beyond the encoding)."""
    bound = decoded.error_bound
    weight = decoded.total_weight
    most = contributors * encoding.max_weight + bound
    if not 0 < weight <= most:
        raise SumOutOfRangeError(
            f"the decoded total weight {weight:g} is outside (0, {most:g}] for {contributors} contributors with "
            f"max_weight={encoding.max_weight:g}; a contributor broke the encoding, the round is void"
        )
    limit = encoding.clip * weight + bound * (1 + encoding.clip) * contributors
    values = decoded.weighted_sum
    # The largest |value| from the extremes: np.abs would hold a second float64 vector of d values.
    largest = max(float(values.max()), -float(values.min())) if values.size else 0.0
    if largest > limit:
        raise SumOutOfRangeError(
            f"a coordinate of the decoded weighted sum is {largest:g}, beyond clip * total weight + error = "
            f"{limit:g}; a contributor broke the encoding, the round is void"
        )
