"""The plan's ``[influence]``: how far one institution can move the model in a round.

Weights are agreed in the plan (equal, or from each institution's declared size), never
claimed by a collaborator, and every round update is bounded in L2 norm. Both sides read
this section: collaborators to weight and bound their own updates, the aggregator to divide
by the agreed total and to check what it decodes (:mod:`fedfair.runtime.aggregator.checks`).
Reading it needs neither torch nor gRPC.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from fedfair.core.errors import ConfigError
from fedfair.pki.names import validate_name
from fedfair.core.tables import Table, field_names, positive_integer
from fedfair.runtime.plan.limits import MAX_ROWS, number_in, positive

WEIGHTINGS = ("equal", "declared")
"""[influence] weights: every institution counts the same, or by the size the plan declares for it."""


@dataclass(frozen=True)
class InfluenceSettings:
    """How far one institution can move the model in a round.

    A weight agreed in the plan, never claimed, and an L2 bound on its update.

    ``weights`` "equal" gives every institution weight 1: each counts the same, whatever its
    size. "declared" gives institution k the weight b_k = round(batch_fraction * n_k) of the size
    n_k that ``sizes`` declares for it, which makes the averaged update Algorithm 1's (the mean
    over every sample of the federation) when the declared sizes are the true ones. Either way
    no collaborator reports a weight the server trusts: the server divides a round's sum by the
    agreed total of the round's contributors and voids a round whose decoded total differs.

    ``sizes`` (name -> rows) also fixes each institution's mini-batch, b_k above, so that under
    DP the batch and the weight are constants of the plan, not functions of the data; DP-SGD
    needs them (:meth:`batch_base`). Institution sizes are public facts for hospitals and banks
    more often than not; a federation that must hide them uses equal weights without DP.

    ``update_norm`` is C, the L2 bound on each institution's round update (delta theta, delta c):
    an honest collaborator scales a longer update into the ball, the aggregator refuses a plain
    upload outside it, and a secure round whose mean update is longer than C is void. One site
    of weight w_k then moves the mean by at most w_k C / W in a plain round (see docs/design.md
    for what secure rounds can and cannot check, and for what many rounds add up to). A plan
    that does not set it gets 2 * lr * local_steps
    (:func:`fedfair.runtime.plan.training.default_update_norm`).
    """

    update_norm: float
    weights: str = "equal"
    # Left out of the hash like ModelSettings.arguments: a table is not hashable.
    sizes: dict[str, int] = dataclasses.field(default_factory=dict, hash=False)

    def batch_base(self, name: str, rows: int) -> int:
        """The n_k an institution's batch fraction applies to: its declared size, else its row count."""
        return self.sizes.get(name, rows)

    def weight_of(self, name: str, batch_fraction: float) -> float:
        """Institution `name`'s agreed weight w_k (a ConfigError if the plan declares no size for it)."""
        if self.weights == "equal":
            return 1.0
        if name not in self.sizes:
            raise ConfigError(
                f'[influence] weights = "declared" but sizes has no entry for {name!r}; add {name} = ROWS to '
                "[influence] sizes"
            )
        return float(declared_batch(self.sizes[name], batch_fraction))

    def largest_weight(self, batch_fraction: float) -> float:
        """The largest agreed weight of any institution: 1 under "equal" weights, else the largest declared b_k.

        A plan's sizes declare exactly its collaborators, so a party that knows the plan but not the names (a site)
        finds the same largest weight as the aggregator.
        """
        if self.weights == "equal":
            return 1.0
        return max(self.weight_of(name, batch_fraction) for name in self.sizes)

    def weight_per_record(self, batch_fraction: float) -> float:
        """The largest w_k / b_k over the institutions the plan sizes: what one record's step is scaled by.

        Under distributed DP a site's update is lr times its clipped sum over its expected batch b_k, sent
        weighted by w_k, so one record moves the secure sum by (w_k / b_k) lr C
        (:func:`fedfair.privacy.calibration.record_sensitivity`), and the noise must cover the largest:
        1 under "declared" weights (w_k = b_k), 1 / min b_k under "equal" ones (w_k = 1). Without sizes
        (no DP: batches are not fixed by the plan) 1, the most an equal weight of 1 over a batch of 1 gives.
        """
        if not self.sizes:
            return 1.0
        return max(
            self.weight_of(name, batch_fraction) / declared_batch(size, batch_fraction)
            for name, size in self.sizes.items()
        )

    def total_weight(self, names: Collection[str], batch_fraction: float) -> float:
        """The agreed total weight of a round's contributors: what the server divides their sum by."""
        return math.fsum(self.weight_of(name, batch_fraction) for name in names)


def declared_batch(size: int, batch_fraction: float) -> int:
    """b_k = round(batch_fraction * n_k), at least 1: core.data.local_batch_size of a declared size."""
    return max(round(batch_fraction * size), 1)


def read_influence(
    source: str, data: Mapping[str, object], n: int, *, default_norm: float, batch_fraction: float, max_weight: float
) -> InfluenceSettings:
    """[influence] for a federation of `n`.

    `default_norm` is C when the plan sets none, and no agreed weight (at `batch_fraction`) may exceed the
    encoding's `max_weight`.
    """
    t = Table.of(source, data, "influence", field_names(InfluenceSettings))
    d = InfluenceSettings(update_norm=default_norm)
    weights = t.string("weights", d.weights, choices=WEIGHTINGS)
    sizes: dict[str, int] = {}
    if t.given("sizes") and t.data["sizes"] != {}:
        value = t.data["sizes"]
        expected = f"a table of institution = rows (1 to {MAX_ROWS}), e.g. {{ hospital-a = 1621, hospital-b = 774 }}"
        if not isinstance(value, Mapping) or not all(
            positive_integer(rows) and rows <= MAX_ROWS for rows in value.values()
        ):
            t.bad("sizes", value, expected)
        for name in value:
            try:
                validate_name(name)
            except ConfigError as error:
                t.fail(f"[influence] sizes: {error}")
        if len(value) != n:
            t.fail(
                f"[influence] sizes declares {len(value)} institutions but the federation has {n}; declare "
                "every collaborator's size once"
            )
        sizes = dict(value)
    if weights == "declared" and not sizes:
        t.fail(
            '[influence] weights = "declared" needs sizes = { NAME = ROWS, ... } for every collaborator; add '
            'them, or use weights = "equal"'
        )
    update_norm = number_in(
        t, "update_norm", positive("the L2 bound on each institution's round update"), d.update_norm
    )
    if weights == "declared" and declared_batch(max(sizes.values()), batch_fraction) > max_weight:
        t.fail(
            f"[influence] sizes give a weight of {declared_batch(max(sizes.values()), batch_fraction)}, above "
            f"[secure_aggregation] max_weight = {max_weight:g}; raise max_weight"
        )
    return InfluenceSettings(weights=weights, sizes=sizes, update_norm=update_norm)
