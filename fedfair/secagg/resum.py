"""A survivor's own unmasking of the claimed sum: the check that holds against colluding survivors.

Where a round re-sums (:attr:`~fedfair.secagg.config.SecAggConfig.resummed`), the server's claim carries every
survivor's masked input and the secrets it rebuilt at UNMASK (:class:`~fedfair.secagg.verify_messages.AggregateClaim`).
A survivor accepts the claimed sum only if it is exactly what those inputs give once unmasked, each input being the
one whose digest the view it signed at CONSISTENCY names, each secret the one its owner committed to in its signed
advertisement. Every masked input is fixed before any share is revealed, so before anyone can know the sum: a
colluding survivor cannot choose its contribution after seeing the others'. The claim also carries the consistency
signatures of t survivors on that view: no share of an honest seed was revealed under any other view, so the re-sum
decides alone and, on the complete graph, a survivor's missing tag does not void the sum (:func:`resum_decides`;
above RESUMMED_WORDS the tag set of such a round carries the material). See docs/security.md, "Verified aggregation".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import UnmaskRefusedError, VerificationError, VerifyReason
from fedfair.secagg import prg
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.messages import AdvertiseKeys
from fedfair.secagg.payloads import View, masked_input_digest
from fedfair.secagg.recovery import Secrets, is_committed, unmasking_streams
from fedfair.secagg.shares import Kind, check_view_signatures
from fedfair.secagg.verify_messages import ResumMaterial


def check_resummed(
    vector: np.ndarray,
    material: ResumMaterial,
    *,
    config: SecAggConfig,
    session: bytes,
    view: View,
    advertisements: Mapping[int, AdvertiseKeys],
    identities: Mapping[int, ec.EllipticCurvePublicKey],
) -> None:
    """Refuse the claimed aggregate ``vector`` unless it is the sum of the masked inputs ``view`` fixes, unmasked.

    ``material`` is what the server says it unmasked the sum from: the claim's, or above RESUMMED_WORDS the tag
    set's of a round with a missing tag. ``view`` is the one this party signed at CONSISTENCY; ``advertisements``
    the signed ones it accepted, whose seed commitments and mask public keys each rebuilt secret must match;
    ``identities`` its peers' identity keys, which the material's consistency signatures on ``view`` must verify
    under.

    Raises:
        VerificationError: as :func:`committed_secrets` and :func:`check_inputs` (the inputs of every survivor);
            FORGED for an aggregate other than the sum they give.
    """
    survivors = view[1]
    secrets = committed_secrets(
        material, config=config, session=session, view=view, advertisements=advertisements, identities=identities
    )
    check_inputs(material.inputs, survivors, vector, config=config, session=session, view=view)
    total = material.inputs[0].copy()
    for masked in material.inputs[1:]:
        np.add(total, masked, out=total)
    masks = unmasking_streams(
        secrets, session=session, config=config, masked=set(survivors), advertisements=advertisements
    )
    prg.apply_masks(total, masks)
    if not np.array_equal(total, vector):
        raise VerificationError(
            config.round,
            VerifyReason.FORGED,
            "the claimed aggregate is not the sum of the survivors' masked inputs, unmasked, that this party re-summed",
        )


def committed_secrets(
    material: ResumMaterial,
    *,
    config: SecAggConfig,
    session: bytes,
    view: View,
    advertisements: Mapping[int, AdvertiseKeys],
    identities: Mapping[int, ec.EllipticCurvePublicKey],
) -> Secrets:
    """The secrets ``material`` carries, once t survivors' signatures on ``view`` and every commitment check out.

    Raises:
        VerificationError: MALFORMED for material without the consistency signatures of t distinct survivors on
            ``view``, or without exactly a seed per survivor and a mask key per dropped party a survivor masked
            with; FORGED for a secret other than the one its owner committed to in its signed advertisement.
    """
    round_number = config.round
    masking_set, survivors, _digests = view
    try:
        check_view_signatures(
            material.signatures, view, session=session, identities=identities, config=config, wanted={}
        )
    except UnmaskRefusedError as error:
        raise VerificationError(
            round_number,
            VerifyReason.MALFORMED,
            f"the re-sum material does not carry the signatures of t survivors on the view this party signed ({error})",
        ) from None
    dropped = set(masking_set) - set(survivors)
    needed_keys = {owner for owner in dropped if config.graph[owner] & set(survivors)}
    seeds, mask_keys = dict(material.seeds), dict(material.mask_keys)
    if (
        len(seeds) != len(material.seeds)
        or len(mask_keys) != len(material.mask_keys)
        or seeds.keys() != set(survivors)
        or mask_keys.keys() != needed_keys
    ):
        raise VerificationError(
            round_number,
            VerifyReason.MALFORMED,
            "the re-sum material does not carry exactly the survivors' seeds and the dropped parties' mask keys",
        )
    secrets = {(Kind.SEED, owner): seed for owner, seed in seeds.items()}
    secrets |= {(Kind.MASK_KEY, owner): key for owner, key in mask_keys.items()}
    for (kind, owner), secret in secrets.items():
        if not is_committed(config, kind, advertisements[owner], secret):
            raise VerificationError(
                round_number,
                VerifyReason.FORGED,
                f"the {kind.value} shown for {config.name_of(owner)} is not the one it committed to",
            )
    return secrets


def check_inputs(
    inputs: Sequence[np.ndarray],
    parties: Sequence[int],
    vector: np.ndarray,
    *,
    config: SecAggConfig,
    session: bytes,
    view: View,
) -> None:
    """Refuse ``inputs`` unless they are the masked inputs of ``parties`` (survivors, in order) that ``view`` names.

    Raises:
        VerificationError: MALFORMED for another count of inputs, or one of another shape than ``vector``; FORGED
            for a masked input whose digest is not the one ``view`` names for its party.
    """
    if len(inputs) != len(parties) or any(
        masked.dtype != vector.dtype or masked.shape != vector.shape for masked in inputs
    ):
        raise VerificationError(
            config.round,
            VerifyReason.MALFORMED,
            f"the material does not carry one masked input for each of {', '.join(map(config.name_of, parties))}",
        )
    digests = dict(zip(view[1], view[2], strict=True))
    for party, masked in zip(parties, inputs, strict=True):
        if masked_input_digest(session, party, masked) != digests[party]:
            raise VerificationError(
                config.round,
                VerifyReason.FORGED,
                f"the masked input shown for {config.name_of(party)} is not the one the view this party signed names",
            )


def resum_decides(config: SecAggConfig) -> bool:
    """Whether a survivor's own re-sum decides a round whose tags did not all arrive, so that tags may be missing.

    On the complete graph a survivor accepts only the sum of the inputs its view fixes, and the material shows t
    survivors signed that view; every honest share was revealed under it (docs/security.md, "Verified
    aggregation"). The tags then play no part in the sum's value, so a survivor that leaves before tagging (a
    crash, an expired certificate, on purpose) does not void the round: up to RESUMMED_WORDS every survivor
    re-summed the claim already, and above it the tag set of such a round carries the material to re-sum it, for
    that round only (every other round there keeps the tag check). On a SecAgg+ graph every survivor's tag is
    needed.
    """
    return config.complete
