"""A site's evaluation figures: the aggregator's record of a sum the site verified is kept, a forged one refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedfair.fairness import sums, tail
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.evaluation import federated_evaluation
from fedfair.runtime.collaborator.figures import EvaluationFigures
from fedfair.runtime.contract import model_digest
from fedfair.runtime.evaluation_figures import Earlier
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, load_shared_settings, shared_settings
from fedfair.secagg import Encoder
from tests.runtime.test_plan import NO_NOISE, aggregator_plan

NAMES = ("site-a", "site-b", "site-c")
THETA = np.zeros(3)
C = 0.9


class Summed:
    """Stands in for the sum driver: the decoded sum of `words`, as the aggregator's unmasking gives it."""

    def __init__(self, decoded: Any) -> None:
        self.decoded = decoded

    def run(self, *args: Any, **kwargs: Any) -> SumOutcome:
        decoded = self.decoded
        return SumOutcome(decoded.weighted_sum, decoded.total_weight, decoded.error_bound, NAMES)


def answered(plan: AggregatorPlan, round_number: int) -> tuple[np.ndarray, Encoder]:
    """The encoded sum of three sites' answers to round `round_number`'s evaluation, and its encoder."""
    rng = np.random.default_rng(round_number)
    encoder = Encoder(sums.ENCODING, len(NAMES))
    words = None
    for _ in NAMES:
        losses, errors = rng.exponential(0.7, 300), (rng.random(300) < 0.2).astype(float)
        if plan.privacy.noised:
            answer = tail.tail_answers(plan.evaluation.tail_query(), losses, errors, np.zeros(300, np.int64), C)
        else:
            answer = sums.local_answers(losses, errors, plan.evaluation.thresholds())
        encoded = encoder.encode(answer, 1.0)
        words = encoded if words is None else words + encoded  # wraps modulo 2^64 as the masked sum does
    assert words is not None
    return words, encoder


def evaluated(plan: AggregatorPlan, site: EvaluationFigures, round_number: int, **earlier: Any) -> dict[str, Any]:
    """Round `round_number`'s evaluation: the site verifies the sum, and the aggregator makes its record of it."""
    words, encoder = answered(plan, round_number)
    digest = model_digest(THETA, C)
    site.asked(round_number, digest, C)
    site.verified(round_number, digest, words, NAMES, encoder)
    repeated = Earlier(digest, **earlier) if earlier else None
    driver = Summed(encoder.decode(words, len(NAMES)))
    _, result = federated_evaluation(plan, driver, round_number, frozenset(NAMES), (THETA, C), b"", 2, repeated)  # type: ignore[arg-type]
    return json.loads(json.dumps(result))


@pytest.mark.parametrize("privacy", [NO_NOISE, {}], ids=["exact", "noised"])
def test_a_record_of_a_verified_sum_is_kept_and_any_changed_figure_refused(tmp_path: Path, privacy: Any) -> None:
    plan = aggregator_plan(privacy=privacy, evaluation={"every": 2}, training={"rounds": 4})
    site = EvaluationFigures("site-a", load_shared_settings(shared_settings(plan)), tmp_path, 2)
    rounds = plan.training.rounds
    records = {number: evaluated(plan, site, number) for number in (2, rounds)}
    metrics = [{"round": number, "status": "applied", "evaluation": record} for number, record in records.items()]
    checked = site.check(metrics)
    assert checked.forged is None and checked.left_out == {}
    assert checked.metrics == metrics  # the aggregator's records are exactly what the site verified
    # A restarted process reads what it verified back from its file.
    again = EvaluationFigures("site-a", load_shared_settings(shared_settings(plan)), tmp_path, 2).check(metrics)
    assert again.forged is None and again.metrics == metrics
    # The attack: the worst-group risk stated 0.05, bounds and all.
    forged = dict(records[rounds], worst_risk=0.05)
    refused = site.check([metrics[0], {**metrics[1], "evaluation": forged}])
    assert refused.forged is not None and f"round {rounds}'s worst_risk is 0.05" in refused.forged
    assert json.loads(Path(site.path or "").read_text())["forged"] == {"round": rounds, "why": refused.forged}
    # Every figure, changed by the least step a float allows, or added, is refused.
    for key, value in records[rounds].items():
        if isinstance(value, float) and key != "round":
            moved = dict(records[rounds], **{key: float(np.nextafter(value, np.inf))})
            assert site.check([{**metrics[1], "evaluation": moved}]).forged is not None, key
    assert site.check([{**metrics[1], "evaluation": {**records[rounds], "best_risk": 0.0}}]).forged is not None
    # Under noise, a site that sat an earlier evaluation out cannot tell the noise an honest aggregator states
    # (the model may have been answered then): it leaves a figure it cannot match out, and keeps no forged one.
    late = EvaluationFigures("site-b", load_shared_settings(shared_settings(plan)), tmp_path, 2)
    words, encoder = answered(plan, rounds)
    late.asked(rounds, model_digest(THETA, C), C)
    late.verified(rounds, model_digest(THETA, C), words, NAMES, encoder)
    unmatched = late.check([{**metrics[1], "evaluation": forged}])
    assert (unmatched.forged is None) is plan.privacy.noised and "0.05" not in json.dumps(unmatched.metrics)


def test_a_record_this_site_did_not_verify_is_left_out(tmp_path: Path) -> None:
    plan = aggregator_plan(privacy=NO_NOISE, evaluation={"every": 2})
    site = EvaluationFigures("site-a", load_shared_settings(shared_settings(plan)), tmp_path, 2)
    other = EvaluationFigures("site-b", load_shared_settings(shared_settings(plan)), tmp_path, 2)
    record = evaluated(plan, other, 2)  # site-a sat this evaluation out
    skipped = {"status": "skipped", "reason": "too few collaborators connected"}
    checked = site.check([{"round": 2, "evaluation": record}, {"round": 4, "evaluation": skipped}])
    assert checked.forged is None and list(checked.left_out) == [2]
    assert checked.metrics[0]["evaluation"]["status"] == "unverified"
    assert "worst_risk" not in json.dumps(checked.metrics) and checked.metrics[1]["evaluation"] == skipped


def test_a_repeated_noised_model_is_checked_for_each_noise_an_honest_aggregator_may_state(tmp_path: Path) -> None:
    plan = aggregator_plan(evaluation={"every": 2})
    site = EvaluationFigures("site-a", load_shared_settings(shared_settings(plan)), tmp_path, 2)
    first = evaluated(plan, site, 2)
    # The same model asked again at round 4: answered from the words kept at round 2, contributors known or not.
    for contributors in (frozenset(NAMES), None):
        again = evaluated(plan, site, 4, round=2, contributors=contributors)
        assert again["answers_of_round"] == 2
        checked = site.check([{"round": 2, "evaluation": first}, {"round": 4, "evaluation": again}])
        assert checked.forged is None and checked.left_out == {}, checked
