"""Issue 98's catch-up applies a round the aggregator aborted before any site verified it: tags are signed at DECIDE.

The bystander's soundness argument (bystander.py): it applies the record's T "only where every accepted site ... signed
tags over that record's digest: at least two honest sites checked and tagged this very record". Tagging is not
applying: each site signs its tags at DECIDE and applies T only at VERIFY, once it checked every other tag. An
aggregator that aborts the round after the DECIDE uploads are in (before VERIFY) holds every accepted site's and the
auditor's signed tags, and no honest site applied anything; kept as applied, the round passes ``check_past_total``,
and a site that missed it steps its chain by a total no honest site stepped by. No colluding site is needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedfair.secagg.bounded.bystander import PastBoundedRound, check_past_total
from fedfair.secagg.bounded.messages import Encoded, ShareOpening
from fedfair.secagg.bounded.simulate import bounded_cast
from fedfair.secagg.bounded.stages import BOUNDED_ROUND, BoundedStage
from fedfair.secagg.bounded.total import TagSet
from fedfair.secagg.round import AnyStage, Opening
from fedfair.secagg.simulate import run_round
from fedfair.core.errors import VerificationError
from tests.secagg.bounded.roundkit import DIMENSION, FRACTIONAL_BITS, UPDATE_NORM
from tests.secagg.bounded.test_bystander import Kept
from tests.secagg.bounded.test_round import WEIGHTS, at_bound


class AbortedAtVerify(Exception):
    """The aggregator announces the round aborted instead of sending VERIFY."""


class AbortingAggregator(Kept):
    """Keeps what it would send, as an honest aggregator keeps a round, then aborts before VERIFY reaches any site."""

    def opening(self, spec: AnyStage, opening: Opening, server: Any) -> Opening:
        kept = super().opening(spec, opening, server)
        if spec.stage is BoundedStage.VERIFY:
            raise AbortedAtVerify
        return kept


def test_a_round_aborted_before_verify_is_not_applied_by_a_site_that_missed_it() -> None:
    cast = bounded_cast(
        dimension=DIMENSION, fractional_bits=FRACTIONAL_BITS, update_norm=UPDATE_NORM, weights=WEIGHTS, witnesses={}
    )
    inputs = {party: at_bound(party, weight) for party, weight in WEIGHTS.items()}
    aggregator = AbortingAggregator()
    with pytest.raises(AbortedAtVerify):
        run_round(BOUNDED_ROUND, cast, inputs.__getitem__, aggregator, verified=True)
    # No site ran VERIFY: none verified or applied a total of this round.
    opening, record, tag_set = (
        aggregator.inputs[stage] for stage in (BoundedStage.SHARE, BoundedStage.DECIDE, BoundedStage.VERIFY)
    )
    assert isinstance(opening, ShareOpening) and isinstance(record, Encoded) and isinstance(tag_set, TagSet)
    past = PastBoundedRound.parsed([opening.to_bytes(), record.data, tag_set.to_bytes()])
    try:
        applied = check_past_total(past, cast.server.parameters)
    except VerificationError:
        return  # what the claim needs: a round no honest site applied is not applied by the late site
    pytest.fail(
        f"the late site applies the total of a round aborted before any site verified it: {applied.total.size} "
        f"coordinates, |T| = {float(np.linalg.norm(applied.total)):.1f} (encoded), accepted {applied.findings.accepted}"
    )
