"""The aggregator's side of the VERIFY stages: claim the sum, collect each survivor's tags, relay them.

The construction (challenge, masked tags, their sum) is :mod:`fedfair.secagg.verify`; the parties' side is
:mod:`fedfair.secagg.verify_client`.
"""

from __future__ import annotations

import logging

from fedfair.core.errors import (
    AuthenticationError,
    ProtocolError,
)
from fedfair.pki.identity import is_valid_signature
from fedfair.secagg import config as config_module
from fedfair.secagg.resum import resum_decides
from fedfair.secagg.server_state import ServerState
from fedfair.secagg.shares import Kind
from fedfair.secagg.verify import TAG_BYTES, Challenge, aggregate_digest, check_sum, tag_payload
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, Material, TagSet
from fedfair.secagg.wire import Stage, check_header

logger = logging.getLogger(__name__)


class VerifyStages(ServerState):
    """The server's VERIFY stages, after :meth:`~fedfair.secagg.server.Server.finish`: claim, tags, relay."""

    def claim(self) -> AggregateClaim:
        """Open VERIFY (after :meth:`finish`): show the survivors the unmasked sum, which commits the server to it.

        Where the round re-sums (``config.resummed``) the claim also carries the survivors' masked inputs, the
        secrets rebuilt at UNMASK and the consistency signatures the unmask request carried.
        """
        self._digest = aggregate_digest(self._session, self._survivors, self._view_inputs, self._sum)
        if not self.config.resummed:
            return AggregateClaim(self._header(Stage.VERIFY), self._sum)
        return AggregateClaim(self._header(Stage.VERIFY), self._sum, *self._material())

    def _material(self) -> Material:
        """What this server unmasked the sum from, for every survivor to unmask it again (:class:`ResumMaterial`)."""
        seeds = sorted((owner, secret) for (kind, owner), secret in self._secrets.items() if kind is Kind.SEED)
        mask_keys = sorted((owner, secret) for (kind, owner), secret in self._secrets.items() if kind is Kind.MASK_KEY)
        inputs = tuple(self._inputs[party] for party in self._survivors)
        assert self._request is not None  # the unmask request was made before the sum was finished
        return inputs, tuple(seeds), tuple(mask_keys), self._request.signatures

    def receive_tag(self, message: AggregateTag) -> None:
        """Accept one survivor's tags, signed by it over the digest of the aggregate this server claimed."""
        check_header(message, self.config, self._session)
        sender = message.sender
        if sender not in self._masked:
            raise ProtocolError(f"party {sender} is not a survivor and cannot tag the aggregate")
        if sender in self._tags:
            raise ProtocolError(f"party {sender} already tagged the aggregate")
        payload = tag_payload(self._session, self._digest, sender, message.tags)
        if len(message.tags) != TAG_BYTES or not is_valid_signature(
            self._identities[sender], message.signature, payload
        ):
            raise AuthenticationError(f"party {sender}'s tag is not signed by it over the claimed aggregate")
        self._tags[sender] = message

    @property
    def untagged(self) -> tuple[int, ...]:
        """The survivors whose tags have not arrived (VERIFY stage).

        Every party refuses the aggregate without them, unless its own re-sum decides the sum
        (:func:`~fedfair.secagg.resum.resum_decides`: on the complete graph, re-summed from the claim or, above
        RESUMMED_WORDS, from the tag set).
        """
        return tuple(sorted(self._masked - self._tags.keys()))

    def tags_add_up(self) -> bool:
        """Whether the tags received sum to the claimed aggregate's challenge dots, as every survivor will check.

        For a server that claimed the true sum, False means a survivor tagged something other than its input
        (which nobody can tell apart from a forged sum): relaying the tags would only make every survivor
        refuse the aggregate, so the runtime aborts the round instead. Costs one challenge over the d + 1 words.
        """
        if self.untagged:
            return False
        challenge = Challenge(self._session, self._digest, self._sum.size)
        return check_sum(challenge.dots(self._sum), (self._tags[party].tags for party in sorted(self._tags)))

    def tag_set(self) -> TagSet:
        """Close VERIFY: relay every tag received to every survivor, which then checks them (:meth:`Client.verify`).

        Where a tag is missing and the claim carried no re-sum material (above RESUMMED_WORDS, on the complete graph:
        :func:`~fedfair.secagg.resum.resum_decides`), the tag set carries it, for every survivor to re-sum the sum
        it tagged; with every tag in, or where the claim carried it, it carries none.
        """
        tags = tuple(self._tags[party] for party in sorted(self._tags))
        if self.untagged and resum_decides(self.config) and not self.config.resummed:
            names = ", ".join(map(self.config.name_of, self.untagged))
            logger.info(
                "session %d: no tag from %s; the tag set carries the survivors' %d masked inputs, for every survivor to "
                "re-sum the sum (above %d words, this round only)",
                self.config.round,
                names,
                len(self._survivors),
                config_module.RESUMMED_WORDS,
            )
            return TagSet(self._header(Stage.VERIFY), tags, *self._material())
        return TagSet(self._header(Stage.VERIFY), tags)
