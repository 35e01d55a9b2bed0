"""A party's masking stages of secure aggregation: MASK, CONSISTENCY and UNMASK.

Mask the encoded input against its neighbours in the masking set, sign the server's view of who survived
once, and reveal the shares that view calls for. The checks by which a party keeps a lying server from both
secrets of one party are listed in docs/design.md ("Inside secure aggregation").
"""

from __future__ import annotations

import numpy as np

from fedfair.core.errors import (
    ConfigError,
    ProtocolError,
    ThresholdError,
    UnmaskRefusedError,
)
from fedfair.pki.identity import sign
from fedfair.secagg import keys, prg
from fedfair.secagg.client_state import ClientState
from fedfair.secagg.graph import check_survivors
from fedfair.secagg.messages import (
    ConsistencySignature,
    MaskedInput,
    MaskingSet,
    SurvivorSet,
    UnmaskRequest,
    UnmaskResponse,
)
from fedfair.secagg.payloads import consistency_payload, masked_input_digest
from fedfair.secagg.shares import revealed_for_view
from fedfair.secagg.wire import Stage, check_header, check_ids


class MaskingStages(ClientState):
    """A party's MASK, CONSISTENCY and UNMASK stages (the last two may be repeated)."""

    def masked_input(self, masking_set: MaskingSet, encoded: np.ndarray) -> MaskedInput:
        """Stage MASK: mask the encoded update against exactly this party's neighbours in U2'.

        ``encoded`` comes from ``config.encoder.encode(weight * delta, weight)``. It is masked
        in place and becomes the message's vector, which saves a copy of d words; pass a copy
        to keep the plain encoding. A refused masking set leaves ``encoded`` untouched.

        Raises:
            UnmaskRefusedError: the masking set contains a party this party accused, or a neighbour
                whose checked shares it does not hold.
            ProtocolError: this party is not in the masking set (it was accused, or its check was lost:
                it takes no further part).
            ThresholdError: the masking set leaves fewer than t of this party's holders (itself included).
        """
        check_header(masking_set, self.config, self._session)
        encoder = self.config.encoder
        if (
            encoded.dtype != encoder.dtype
            or encoded.shape != (self.config.dimension + 1,)
            or not (encoded.flags.c_contiguous and encoded.flags.writeable)
        ):
            raise ConfigError(
                f"the encoded update must be a writeable {np.dtype(encoder.dtype).name} array of length "
                f"{self.config.dimension + 1}; "
                "encode it with config.encoder.encode(weighted_vector, weight)"
            )
        check_ids(masking_set.parties, "the masking set")
        members = set(masking_set.parties)
        unknown = members - self._directory.keys()
        if unknown:
            raise ProtocolError(f"the masking set names party {min(unknown)}, which is not in this session")
        if self.party not in members:
            raise ProtocolError(
                "the masking set leaves this party out (it was accused or its share check was lost); "
                "it takes no further part in this round"
            )
        accused = members & self._accused
        if accused:
            raise UnmaskRefusedError(
                f"the masking set includes party {min(accused)}, which this party accused at CHECK; refused"
            )
        maskers = members & self.config.graph[self.party]
        missing = maskers - self._held.keys()
        if missing:
            raise UnmaskRefusedError(
                f"the masking set includes neighbour {min(missing)}, whose checked shares this party does not hold; "
                "refused"
            )
        if len(maskers) + 1 < self.config.t:
            raise ThresholdError(
                f"the masking set leaves {len(maskers) + 1} holders of this party's secrets, below the threshold "
                f"{self.config.t}; round aborted"
            )
        masks: list[prg.Mask] = [(keys.self_mask_key(self._seed, self._session, self.party), 1)]
        # The smaller id adds, the larger subtracts: each pair cancels in the sum.
        masks += [(self._pair_keys[peer], 1 if self.party < peer else -1) for peer in sorted(maskers)]
        if self._verified is True:
            self._plain = encoded.copy()
        prg.apply_masks(encoded, masks)
        self._input_digest = masked_input_digest(self._session, self.party, encoded)
        self._masking_set = masking_set.parties
        return MaskedInput(self._header(Stage.MASK), self.party, encoded)

    def consistency(self, survivor_set: SurvivorSet) -> ConsistencySignature:
        """Stage CONSISTENCY: sign the server's view (U2', U3, the survivors' masked-input digests), once.

        The same view asked again gets the same signature again.

        Raises:
            UnmaskRefusedError: a view whose U2' differs from the masking set this party masked for,
                whose U3 is not within U2' or leaves this party out, that names no digest for some survivor
                or another one for this party's own masked input, any view other than the one it
                already signed, and, on a SecAgg+ graph, survivors whose subgraph max_colluding of them
                could cut (the aggregator would unmask the sum of a piece:
                :func:`~fedfair.secagg.graph.check_survivors`).
            ThresholdError: U3 has fewer than t parties.
        """
        if self._signed is not None:
            check_header(survivor_set, self.config, self._session)
            if self._view != (survivor_set.masking_set, survivor_set.survivors, survivor_set.inputs):
                raise UnmaskRefusedError("this party already signed another view of the round; refused")
            return self._signed
        check_header(survivor_set, self.config, self._session)
        check_ids(survivor_set.masking_set, "the survivor set's masking set")
        check_ids(survivor_set.survivors, "the survivor set")
        if survivor_set.masking_set != self._masking_set:
            raise UnmaskRefusedError("the survivor set's masking set differs from the one this party masked for")
        survivors = set(survivor_set.survivors)
        if not survivors <= set(survivor_set.masking_set):
            raise UnmaskRefusedError("the survivor set names a party outside the masking set; refused")
        if self.party not in survivors:
            raise UnmaskRefusedError(
                "the survivor set leaves this party out although it sent its masked input; refused"
            )
        if len(survivors) < self.config.t:
            raise ThresholdError(f"only {len(survivors)} survivors, below the threshold {self.config.t}; round aborted")
        check_survivors(self.config.graph, survivors, self.config.max_colluding)
        if len(survivor_set.inputs) != len(survivor_set.survivors):
            raise UnmaskRefusedError("the survivor set does not name one masked-input digest per survivor; refused")
        if survivor_set.inputs[survivor_set.survivors.index(self.party)] != self._input_digest:
            raise UnmaskRefusedError("the survivor set names another masked input for this party than it sent; refused")
        view = (survivor_set.masking_set, survivor_set.survivors, survivor_set.inputs)
        signature = sign(self._identity_key, consistency_payload(self._session, *view))
        self._view = view
        self._signed = ConsistencySignature(self._header(Stage.CONSISTENCY), self.party, signature)
        return self._signed

    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Stage UNMASK: reveal seed shares of survivors and mask-key shares of dropped peers.

        Which kind of share each peer gets follows from the one view this party signed, so no
        later request can obtain the other kind. The same request again gets the same answer.

        Raises:
            UnmaskRefusedError: the request's survivors and dropped are not exactly the view this party
                signed, or it carries valid consistency signatures of fewer than t distinct survivors on
                that view (fewer than t of an owner's holders on a SecAgg+ graph).
        """
        if self._view is None:
            raise ProtocolError("unmask() called before this party signed the survivor set")
        check_header(request, self.config, self._session)
        if self._answered is not None and self._answered[0] == request:
            return self._answered[1]
        check_ids(request.survivors, "the unmask request's survivors")
        check_ids(request.dropped, "the unmask request's dropped parties")
        masking_set, survivors, _inputs = self._view
        if request.survivors != survivors or request.masking_set != masking_set:
            raise UnmaskRefusedError(
                "the unmask request's survivors or dropped parties differ from the view this party signed; refused"
            )
        seed_shares, key_shares = revealed_for_view(
            self._held,
            request.signatures,
            self._view,
            session=self._session,
            identities=self._identities,
            config=self.config,
        )
        response = UnmaskResponse(self._header(Stage.UNMASK), self.party, seed_shares, key_shares)
        self._answered = (request, response)
        return response
