"""The aggregator's masking stages of secure aggregation: MASK, CONSISTENCY and UNMASK, and the sum's finish.

Masked inputs are summed as they arrive, so only the sum is ever unmasked; :meth:`MaskingStages.ready` says
when UNMASK may close early. How culprits are named is in docs/design.md ("Inside secure aggregation").
"""

from __future__ import annotations

import numpy as np

from fedfair.core.errors import (
    AuthenticationError,
    ProtocolError,
    ThresholdError,
    UnmaskRefusedError,
)
from fedfair.pki.identity import is_valid_signature
from fedfair.secagg import prg
from fedfair.secagg.graph import check_survivors
from fedfair.secagg.messages import (
    ConsistencySignature,
    MaskedInput,
    SurvivorSet,
    UnmaskRequest,
    UnmaskResponse,
)
from fedfair.secagg.payloads import consistency_payload, masked_input_digest
from fedfair.secagg.recovery import Recovery, check_range, unmasking_streams
from fedfair.secagg.resum import resum_decides
from fedfair.secagg.server_state import AggregateResult, ServerState
from fedfair.secagg.shares import Kind
from fedfair.secagg.wire import SUM_STAGES, Stage, check_header


class MaskingStages(ServerState):
    """The server's MASK, CONSISTENCY and UNMASK stages: sum the masked inputs, fix the survivors, unmask the sum."""

    def receive_masked_input(self, message: MaskedInput) -> None:
        """Add one party's masked input to the running sum, and keep its digest for the survivors to sign.

        The input itself is kept where the survivors may re-sum the inputs to check the sum: every round up to
        RESUMMED_WORDS (:attr:`~fedfair.secagg.config.SecAggConfig.resummed`), and above it, on the complete graph, a
        round whose tags do not all arrive (:func:`~fedfair.secagg.resum.resum_decides`). Otherwise it is never
        stored on its own.
        """
        check_header(message, self.config, self._session)
        if message.sender not in self._masking:
            raise ProtocolError(f"party {message.sender} sent a masked input but is not in the masking set")
        if message.sender in self._masked:
            raise ProtocolError(f"party {message.sender} already sent its masked input this round")
        if message.vector.dtype.itemsize != self._sum.dtype.itemsize or message.vector.shape != self._sum.shape:
            raise ProtocolError(f"party {message.sender}'s masked input has the wrong word size or length")
        np.add(self._sum, message.vector, out=self._sum)
        self._input_digests[message.sender] = masked_input_digest(self._session, message.sender, message.vector)
        if self.config.resummed or resum_decides(self.config):
            self._inputs[message.sender] = message.vector
        self._masked.add(message.sender)

    def survivor_set(self) -> SurvivorSet:
        """Close MASK: U3 is every party whose masked input arrived; every survivor is asked to sign the view."""
        self._require_quorum(len(self._masked), "sent masked inputs")
        try:
            # Every survivor refuses to sign a view that colluders could cut; say so once, here.
            check_survivors(self.config.graph, self._masked, self.config.max_colluding)
        except UnmaskRefusedError as error:
            raise ThresholdError(f"{error}; round aborted") from None
        self._survivors = tuple(sorted(self._masked))
        return SurvivorSet(self._header(Stage.CONSISTENCY), self._masking, self._survivors, self._view_inputs)

    def receive_consistency(self, message: ConsistencySignature) -> None:
        """Accept one survivor's signature over the view (U2', U3, masked-input digests) this server sent."""
        check_header(message, self.config, self._session)
        sender = message.sender
        if sender not in self._masked:
            raise ProtocolError(f"party {sender} is not a survivor and cannot sign the survivor set")
        if sender in self._signatures:
            raise ProtocolError(f"party {sender} already signed the survivor set")
        payload = consistency_payload(self._session, self._masking, self._survivors, self._view_inputs)
        if not is_valid_signature(self._identities[sender], message.signature, payload):
            raise AuthenticationError(f"party {sender}'s consistency signature does not verify over this view")
        self._signatures[sender] = message.signature

    def unmask_request(self) -> UnmaskRequest:
        """Close CONSISTENCY: ask the survivors for their shares, with the t or more signatures they need."""
        self._require_quorum(len(self._signatures), "signed the survivor set")
        dropped = tuple(sorted(set(self._masking) - self._masked))
        self._request = UnmaskRequest(
            self._header(Stage.UNMASK), self._survivors, dropped, tuple(sorted(self._signatures.items()))
        )
        self._needed = [(Kind.SEED, owner) for owner in self._survivors]
        # A dropped party's mask key matters only if some survivor masked with it.
        self._needed += [(Kind.MASK_KEY, owner) for owner in dropped if self.config.graph[owner] & self._masked]
        dealt = {sender: message.shares for sender, message in self._share_messages.items()}
        self._recovery = Recovery(self.config, self._session, dealt, self._advertisements)
        return self._request

    def receive_unmask_response(self, message: UnmaskResponse) -> None:
        """Accept one survivor's shares: seed shares of survivors, mask-key shares of dropped parties."""
        check_header(message, self.config, self._session)
        assert self._request is not None  # set when the phase began
        responder = message.sender
        if responder not in self._masked:
            raise ProtocolError(f"party {responder} is not a survivor and cannot answer the unmask request")
        if responder in self._responders:
            raise ProtocolError(f"party {responder} already answered the unmask request")
        recovery = self._recovering()
        seeds = recovery.parse_revealed(responder, message.seed_shares, set(self._request.survivors))
        mask_keys = recovery.parse_revealed(responder, message.key_shares, set(self._request.dropped))
        recovery.add(responder, Kind.SEED, seeds)
        recovery.add(responder, Kind.MASK_KEY, mask_keys)
        self._responders.add(responder)

    def ready(self) -> bool:
        """Whether every secret the sum needs can already be rebuilt and verified (False before the unmask request).

        Rebuilt secrets are kept, so calling this after each response costs little; a
        runtime may close the stage as soon as it says True.
        """
        recovery = self._recovery
        if recovery is None:
            return False
        return all(recovery.rebuild(kind, owner) is not None for kind, owner in self._needed)

    def finish(self) -> AggregateResult:
        """Close UNMASK: rebuild and verify the secrets, strip the masks from the sum, decode and check it.

        Any error aborts the round (its runner's :class:`~fedfair.secagg.round.ServerOrder`): no result exists to apply.

        Raises:
            ThresholdError: too few valid shares of a secret, naming the culprits.
            ProtocolError: signed shares that do not rebuild the committed secret, naming the culprits.
            SumOutOfRangeError: the decoded sum is impossible for honest inputs.
        """
        recovery = self._recovering()
        secrets, suspects = recovery.rebuild_all(self._needed)
        failed = [key for key in self._needed if key not in secrets]
        for kind, owner in (key for key in self._needed if key in suspects):
            for party, reason in recovery.audit(kind, owner).items():
                self._name(party, reason)
                self._proven.add(party)
        if failed:
            raise recovery.failure(failed, self.culprits)
        masks = unmasking_streams(
            secrets, session=self._session, config=self.config, masked=self._masked, advertisements=self._advertisements
        )
        prg.apply_masks(self._sum, masks)
        self._secrets = secrets
        contributors = self._survivors
        decoded = self.config.encoder.decode(self._sum, len(contributors))
        check_range(decoded, len(contributors), self.config.encoding)
        roster = set(range(1, self.config.size + 1))
        # Who went silent in each stage of the sum, in the stages' order.
        silent = (
            roster - self._advertisements.keys(),
            self._advertisements.keys() - self._share_messages.keys(),
            self._share_messages.keys() - self._checks.keys(),
            set(self._masking) - self._masked,
            self._masked - self._signatures.keys(),
            self._masked - self._responders,
        )
        dropped = dict(zip(SUM_STAGES, silent, strict=True))
        return AggregateResult(
            encoded_sum=self._sum,
            decoded=decoded,
            contributors=contributors,
            dropped={stage: tuple(sorted(parties)) for stage, parties in dropped.items()},
            culprits=self.culprits,
            accusations=self.accusations,
        )
