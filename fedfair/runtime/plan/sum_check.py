"""Which check a plan's secure training sums get: every site re-sums them, or sites re-check each other's inputs.

``fedfair plan show`` prints it for the plan's model size d and roster n. The rule is the secure-aggregation
library's own (:attr:`~fedfair.secagg.config.SecAggConfig.resummed` and ``rechecked``,
:func:`~fedfair.secagg.resum.resum_decides`),
asked of the config a round of the whole roster builds; docs/security.md, "Verified aggregation", gives the
soundness of each.
"""

from __future__ import annotations

from fedfair.core.update import update_dimension
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan
from fedfair.secagg.config import RESUMMED_WORDS, SecAggConfig
from fedfair.secagg.resum import resum_decides


def round_config(plan: AggregatorPlan, parameters: int) -> SecAggConfig:
    """The config of a training round of the whole roster, for a model of `parameters` numbers."""
    secure = plan.secure_aggregation
    return SecAggConfig(
        plan.federation_id,
        1,
        plan.collaborators,
        update_dimension(parameters, plan.training.local.corrects_drift),
        secure.encoding(),
        secure.security(len(plan.collaborators)),
    )


def sum_check_lines(config: SecAggConfig) -> list[str]:
    """What the plan's operator and every institution are told of the check in force over `config`'s sums."""
    words, parties = config.dimension + 1, config.size
    largest = RESUMMED_WORDS // parties - 1
    shape = f"d = {config.dimension:,} (an update's length), n = {parties} sites"
    colluding = config.security.max_colluding
    sound = f"sound up to max_colluding = {colluding} colluders"
    if config.resummed:
        check = f"sums re-summed by every site ({sound})"
    elif config.rechecked:
        check = (
            f"sums re-checked, each site's masked input by {colluding + 1} other sites ({sound}; a site downloads "
            f"{colluding + 1} masked inputs and the sum's carries)"
        )
    else:
        check = f"tags ({sound}: the aggregator alone)"
    lines = [
        f"training sums: {check}; {shape}; every site re-sums up to d = {largest:,} at n = {parties} "
        f"(n x (d + 1) <= {RESUMMED_WORDS:,} words), here {parties * words:,}, and above that "
        + ("re-checks" if colluding > 0 else "checks the tags (no colluder to re-check against)")
    ]
    if resum_decides(config) and config.resummed:
        lines.append("a site that leaves before its tag of a sum costs no round: every other site's re-sum decides")
    elif resum_decides(config):
        lines.append(
            "a site that leaves before its tag of a sum costs no round: that round alone is re-summed by every "
            f"other site (sound up to max_colluding = {config.security.max_colluding} colluders; the n masked inputs, "
            f"{parties * words:,} words, are sent with the tags)"
        )
    else:
        lines.append("a site that leaves before its tag of a sum voids that round (its tag is needed to check it)")
    return lines
