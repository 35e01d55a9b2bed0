"""The plan's learning settings: the sections the aggregator shares with every collaborator.

``[objective]`` and ``[training]`` are read straight into the learning core's
:class:`~fedfair.core.config.ObjectiveConfig` and :class:`~fedfair.core.config.TrainingConfig`
(:mod:`fedfair.runtime.plan.training`). The other sections feed several core
objects, so each has a frozen dataclass here with exactly one converter per object
it feeds (:meth:`SecureAggregationSettings.encoding`, :meth:`SecureAggregationSettings.security`,
:meth:`ModelSettings.build`, :meth:`EvaluationSettings.thresholds`): nowhere else is a
setting copied field by field. ``[model]`` and ``[influence]`` have modules of their own
(:mod:`fedfair.runtime.plan.model`, :mod:`fedfair.runtime.plan.influence`).

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedfair.core.config import Interval, ObjectiveConfig, TrainingConfig
from fedfair.core.errors import ConfigError
from fedfair.datasets.schema import Schema
from fedfair.datasets.statistics import STATISTICS_MAX_SITES
from fedfair.fairness import sums
from fedfair.runtime.composition_counts import CompositionColumn, composition_columns, composition_length
from fedfair.runtime.plan.evaluation import EvaluationSettings, read_evaluation
from fedfair.runtime.plan.influence import InfluenceSettings, read_influence
from fedfair.runtime.plan.input_bound import NO_INPUT_BOUND, TWO_VERIFIERS, input_bound_kind, read_input_bound
from fedfair.runtime.plan.limits import PLAN_NUMBER_MAX, number_in, positive
from fedfair.runtime.plan.model import ModelSettings, read_model
from fedfair.runtime.plan.privacy import (
    PlanPrivacy,
    plan_floor,
    read_plan_privacy,
    statistics_release,
    training_noise,
)
from fedfair.runtime.plan.training import batch_fraction, default_update_norm, read_objective, read_training
from fedfair.core.tables import Table, field_names
from fedfair.privacy.distributed import TrainingNoise, honest_parties
from fedfair.privacy.ring import Ring
from fedfair.secagg import EncodingConfig, SecurityParameters, check_no_wraparound
from fedfair.secagg.config import holders_per_secret, threshold_in_force
from fedfair.secagg.training_noise import noised_encoding
from fedfair.secagg.graph import default_degree
from fedfair.secagg import kinds as kinds  # registers the built-in round kinds, which a plan names
from fedfair.secagg.round import default_round_kind, round_kind

if TYPE_CHECKING:
    from fedfair.core.algorithm import FedSRCVaR

DROPOUT_POLICIES = ("allowed", "none")
"""[secure_aggregation] dropouts: whether a round may finish without some collaborators."""
WORD_BITS = (16, 32, 64)
"""[secure_aggregation] modulus_bits: the word sizes the secure sum's encoding computes in."""
AUTO = "auto"
"""``[secure_aggregation] neighbours = "auto"``: the masking graph's degree follows the roster's size."""


@dataclass(frozen=True)
class SecureAggregationSettings:
    """Bonawitz et al. double masking, on the complete graph or a SecAgg+ graph.

    ``neighbours``: None ("auto" in a plan) picks the degree from the roster's size
    (:func:`fedfair.secagg.graph.default_degree`: the complete graph below about 20
    collaborators, k = 2 ceil(log2 n) + 2 max_colluding above); 0 is the complete graph, k a
    k-regular graph drawn per round over the plan's whole roster.

    ``threshold`` None means the smallest t the threshold rule allows for each round's p
    participants (fedfair.secagg.threshold_for: floor(p/2) + 1 when max_colluding is 0).
    ``max_weight`` bounds a collaborator's weight b_k, which the fixed-point encoding must
    hold. ``max_colluding`` is the collusion bound the federation assumes: how many
    collaborators may pool what they know with the aggregator. The plan is refused unless
    the threshold satisfies the rule for the full roster (fedfair.secagg.check_threshold),
    the worst-case sum of every collaborator's update fits the words
    (fedfair.secagg.check_no_wraparound), and the quorum keeps at least two honest inputs
    beside the colluders (max_colluding + 2).

    ``dropouts`` "allowed" lets a round finish without parties that dropped (down to t
    survivors, and never below the manifest's min_round_size). Then sums over survivor
    sets that differ by one site on *consecutive* models leak that site's update
    approximately (the models differ by one round's step); only DP bounds that. "none"
    makes every collaborator of the plan a survivor of every round or the round fails
    (collaborators sign no smaller survivor set; the quorum must be the whole roster):
    no such pair of sums exists, at the price of a federation that stalls while one
    institution is down.
    """

    enabled: bool = True
    threshold: int | None = None
    modulus_bits: int = 64
    fractional_bits: int = 20
    clip: float = 10.0
    neighbours: int | None = None
    max_weight: float = 1e6
    max_colluding: int = 0
    dropouts: str = "allowed"
    input_bound: str = NO_INPUT_BOUND
    """Whether each party proves its input within its bound, and to whom (fedfair.runtime.plan.input_bound)."""
    auditor: str | None = None
    """The second verifier under input_bound = "two_verifiers": an auditor institution of the manifest."""
    round_kind: str | None = None
    """The registered round kind (fedfair.secagg.round.register_round_kind) a training round runs, where a plug-in
    brings its own; None: the one the input bound implies (:attr:`training_kind`)."""

    @property
    def bounds_inputs(self) -> bool:
        """Whether every site proves its update within its bound to two verifiers (a training round's bounded sum)."""
        return self.input_bound == TWO_VERIFIERS

    @property
    def training_kind(self) -> str:
        """The name of the round kind a training round runs.

        ``round_kind``, else the kind the input bound implies (:func:`input_bound_kind`), else the default kind.
        """
        if self.round_kind is not None:
            return self.round_kind
        return input_bound_kind(self.input_bound) or default_round_kind().name

    @property
    def tolerates_dropouts(self) -> bool:
        """Whether a round may finish without some of the plan's collaborators (``dropouts``)."""
        return self.dropouts != "none"

    def encoding(self) -> EncodingConfig:
        """The fixed-point encoding of a training update (secagg's EncodingConfig)."""
        return EncodingConfig(
            clip=self.clip,
            max_weight=self.max_weight,
            fractional_bits=self.fractional_bits,
            modulus_bits=self.modulus_bits,
        )

    def security(self, collaborators: int) -> SecurityParameters:
        """The security parameters of every secure sum of a plan for `collaborators` (secagg's SecurityParameters).

        Built once per process where the plan meets its manifest (after fedfair.runtime.manifest_plan.check_bounds),
        then carried whole to the driver, a collaborator's steps, the auditor and each sum.
        """
        return SecurityParameters(self.max_colluding, self.threshold, self.mask_neighbours(collaborators))

    def mask_neighbours(self, collaborators: int) -> int | None:
        """The masking graph's degree for a plan of ``collaborators``, as the secure-aggregation library takes it.

        None means the complete graph.
        """
        if self.neighbours is None:
            return default_degree(collaborators, self.max_colluding)
        return self.neighbours or None


@dataclass(frozen=True)
class QuorumSettings:
    """How many collaborators a round needs, and how long each stage waits for them.

    At most ``round_timeout_seconds``, and with ``grace_factor`` = k at most k x the stage's median answer time
    (fedfair.runtime.aggregator.stages.StageTiming), and a round one such grace for a site over all its stages
    (RoundGrace), so one slow site cannot hold every round up. ``aborted_rounds_allowed`` rounds may abort
    (or, for a site, run without its update) and the run still exits 0 (with a warning): the exit statuses'
    tolerance (docs/operations.md, "Exit statuses").
    """

    min_collaborators: int = 2
    round_timeout_seconds: float = 300.0
    grace_factor: float | None = None
    aborted_rounds_allowed: int = 0


@dataclass(frozen=True)
class LearningSettings:
    """The plan's learning sections: everything collaborators learn of the plan besides its id."""

    objective: ObjectiveConfig
    model: ModelSettings
    training: TrainingConfig
    influence: InfluenceSettings
    secure_aggregation: SecureAggregationSettings
    quorum: QuorumSettings
    evaluation: EvaluationSettings
    schema: Schema | None
    """The federation's table ([schema]): columns, categories, missing values. With one, every
    collaborator encodes its own table with statistics of all tables together (fedfair.runtime.
    preprocessing) and the model's input size is the encoder's; without one, collaborators bring
    data already encoded to the plan's [model] features."""
    privacy: PlanPrivacy
    """The plan's [privacy]: noise inside the secure sum of training updates and evaluation answers
    (fedfair.runtime.plan.privacy); exact sums without it."""

    @property
    def batch_fraction(self) -> float:
        """[training] batch_fraction, which every plan has (`PLAN_TRAINING`)."""
        return batch_fraction(self.training)

    def algorithm(self) -> FedSRCVaR:
        """FedSRCVaR with this plan's local steps and bound: the rules both processes apply."""
        from fedfair.core.algorithm import FedSRCVaR  # torch is loaded by training, not by reading a plan

        return FedSRCVaR(self.training.local, bound=self.objective.bound, momentum=self.training.server_momentum)

    def survivor_floor(self, collaborators: int) -> int:
        """The fewest survivors any secure sum of a plan for `collaborators` can have (plan.privacy.plan_floor).

        Under dropouts the least threshold t in force in any round from [quorum] min_collaborators parties up,
        on the plan's masking graph, by the secure-aggregation protocol's own rules.
        """
        secure = self.secure_aggregation
        return plan_floor(
            collaborators, self.quorum.min_collaborators, secure.security(collaborators), secure.tolerates_dropouts
        )

    def training_noise(self, collaborators: int, dimension: int) -> tuple[TrainingNoise, float]:
        """Under [privacy] mode = "distributed".

        The calibrated noise of training updates of `dimension` values and each party's share of it, carried by
        the honest parties of the smallest survivor set the plan allows
        (fedfair.runtime.plan.privacy.training_noise). Under the input bound the auditor adds it all
        (:mod:`fedfair.runtime.plan.bounded_noise`), in a 52-bit field rather than the plan's words.
        """
        secure, training = self.secure_aggregation, self.training
        floor = self.survivor_floor(collaborators)
        # At least one honest party here; party_mu refuses a floor that leaves none, naming the fix.
        honest = min(collaborators, max(1, honest_parties(floor, secure.max_colluding)))
        per_record = self.influence.weight_per_record(self.batch_fraction)
        # The encoder bounds a party's weighted vector by the clipped sum of a Poisson batch of weight / (w_k / b_k)
        # expected records (fedfair.privacy.rounding.batch_radius): the ring counts the largest, max_weight / (w_k / b_k).
        # Under the input bound the sum is in F_p, whose Layout holds the bound: no word of the plan wraps.
        ring = (
            None
            if secure.bounds_inputs
            else Ring(secure.modulus_bits, collaborators, honest, secure.max_weight / per_record)
        )
        return training_noise(
            self.privacy,
            training.local,
            self.objective,
            training.rounds,
            self.batch_fraction,
            dimension,
            floor,
            secure.max_colluding,
            per_record,
            ring,
        )

    def training_encoding(
        self, federation_id: str, collaborators: int, round_number: int, dimension: int
    ) -> EncodingConfig:
        """The encoding of round `round_number`'s training updates of `dimension` values.

        The plain one, or under [privacy] mode = "distributed" with the round's noise step; the aggregator and
        every collaborator derive the same one. Under the input bound no site noises: the auditor adds the noise
        (:mod:`fedfair.runtime.plan.bounded_noise`), and the sites encode at the noise's fractional bits.
        """
        encoding = self.secure_aggregation.encoding()
        if not self.privacy.distributed:
            return encoding
        noise, share = self.training_noise(collaborators, dimension)
        if self.secure_aggregation.bounds_inputs:
            return dataclasses.replace(encoding, fractional_bits=noise.fractional_bits)
        return noised_encoding(encoding, noise, share, federation_id, round_number, dimension)

    def counted_columns(self, round_number: int) -> tuple[CompositionColumn, ...]:
        """The columns the evaluation of `round_number` counts the worst group by.

        The plan's [evaluation] composition at the final round, none before.
        """
        if round_number != self.training.rounds:
            return ()
        return composition_columns(self.schema, self.evaluation.composition)

    def evaluation_length(self, round_number: int) -> int:
        """The evaluation vector's length at `round_number`.

        The threshold sums (the tail sums under [privacy] report_epsilon), then any composition counts.
        """
        answers = self.evaluation.tail_query().length if self.privacy.noised else sums.vector_length()
        return answers + composition_length(self.counted_columns(round_number))

    def learning_sections(self) -> dict[str, Any]:
        """The sections by name (to build a plan from them, or to share them); schema may be None."""
        return {name: getattr(self, name) for name in LEARNING_SECTIONS}


LEARNING_SECTIONS = tuple(field.name for field in dataclasses.fields(LearningSettings))


# ---------------------------------------------------------------- reading the sections


def _secure_aggregation(source: str, data: Mapping[str, object], n: int) -> SecureAggregationSettings:
    t = Table.of(source, data, "secure_aggregation", field_names(SecureAggregationSettings))
    d = SecureAggregationSettings()
    enabled = t.boolean("enabled", d.enabled)
    if enabled and n < 2:
        t.fail(
            "[secure_aggregation] needs at least 2 collaborators to hide anyone's update; "
            "add collaborators or set enabled = false"
        )
    threshold = t.integer("threshold", low=2) if t.given("threshold") else None
    if threshold is not None and threshold > n:
        t.fail(
            f"[secure_aggregation] threshold = {threshold} exceeds the {n} collaborators; lower it "
            f"(or omit it for floor(p/2)+1 of each round's p participants)"
        )
    modulus_bits = t.integer("modulus_bits", d.modulus_bits)
    if modulus_bits not in WORD_BITS:
        t.bad("modulus_bits", modulus_bits, "16, 32 or 64 (the masked words' size in bits)")
    fractional_bits = t.integer("fractional_bits", d.fractional_bits, low=0)
    if fractional_bits >= modulus_bits:
        t.fail(
            f"[secure_aggregation] fractional_bits = {fractional_bits} must be below modulus_bits = {modulus_bits}; lower it"
        )
    clip = number_in(t, "clip", positive("the bound on each coordinate"), d.clip)
    # Shared settings travel as JSON, where "auto" is null.
    raw = t.data.get("neighbours")
    if raw is not None and raw != AUTO and (not isinstance(raw, int) or isinstance(raw, bool) or raw < 0):
        t.bad("neighbours", raw, '"auto" or an integer >= 0 (0: the complete graph)')
    neighbours = None if raw is None or raw == AUTO else int(raw)
    if neighbours and not 2 <= neighbours <= n - 1:
        t.fail(
            f'[secure_aggregation] neighbours = {neighbours} must be "auto", 0 (complete graph) or in 2..{n - 1}; '
            "fix the value"
        )
    if neighbours and neighbours < n - 1 and neighbours * n % 2:
        # Every round would fail drawing its graph (fedfair.secagg.graph.regular_graph): k n / 2 edges.
        t.fail(
            f"[secure_aggregation] neighbours = {neighbours}: no graph gives each of {n} collaborators "
            f"{neighbours} neighbours (k x n must be even); use {neighbours - 1} or {neighbours + 1}"
        )
    max_weight = number_in(
        t, "max_weight", Interval(1.0, PLAN_NUMBER_MAX, meaning="the largest batch b_k"), d.max_weight
    )
    max_colluding = t.integer("max_colluding", d.max_colluding, low=0, high=n)
    dropouts = t.string("dropouts", d.dropouts, choices=DROPOUT_POLICIES)
    input_bound, auditor = read_input_bound(t, enabled)
    round_kind = _round_kind(t, enabled, input_bound) if t.given("round_kind") else None
    if enabled:
        # The threshold rule for a round of the full roster (m holders of each secret, up to c colluders), and its
        # worst-case sum within the words: the protocol's own checks, before any round is built.
        degree = default_degree(n, max_colluding) if neighbours is None else neighbours or None
        try:
            threshold_in_force(threshold, holders_per_secret(n, n, degree), max_colluding)
            check_no_wraparound(clip, fractional_bits, modulus_bits, n, max_weight)
        except ConfigError as error:
            t.fail(f"[secure_aggregation] with {n} collaborators and max_colluding = {max_colluding}: {error}")
    return SecureAggregationSettings(
        enabled,
        threshold,
        modulus_bits,
        fractional_bits,
        clip,
        neighbours,
        max_weight,
        max_colluding,
        dropouts,
        input_bound,
        auditor,
        round_kind,
    )


def _round_kind(t: Table, enabled: bool, input_bound: str) -> str:
    """[secure_aggregation] round_kind: a registered kind, in a secure plan that does not bound its inputs."""
    name = t.string("round_kind")
    if not enabled:
        t.fail("[secure_aggregation] round_kind names a secure round, but enabled = false; remove round_kind")
    if input_bound != NO_INPUT_BOUND:
        t.fail(
            f'[secure_aggregation] round_kind = "{name}" and input_bound = "{input_bound}" each name the training '
            "round's kind; keep one"
        )
    try:
        round_kind(name)
    except ConfigError as error:
        t.fail(f"[secure_aggregation] round_kind: {error}")
    return name


def _quorum(source: str, data: Mapping[str, object], n: int, secagg: SecureAggregationSettings) -> QuorumSettings:
    t = Table.of(source, data, "quorum", field_names(QuorumSettings))
    if not secagg.enabled:
        least = default = 1
    elif secagg.threshold is not None:
        least = default = secagg.threshold
    else:
        # Secure aggregation needs two parties; by default a majority of the plan takes part.
        least, default = 2, max(2, n // 2 + 1)
    # Colluders subtract their own inputs from a sum: two honest inputs must remain.
    isolating = secagg.max_colluding + 2 if secagg.enabled else 1
    if not secagg.tolerates_dropouts:
        # Every round holds every collaborator, so a round starts only with all of them.
        least = default = n
    minimum = t.integer("min_collaborators", max(default, isolating), low=1)
    if minimum > n:
        t.fail(f"[quorum] min_collaborators = {minimum} exceeds the {n} collaborators; lower it")
    if minimum < least and not secagg.tolerates_dropouts:
        t.fail(
            f'[quorum] min_collaborators = {minimum} but [secure_aggregation] dropouts = "none" needs every one '
            f"of the {n} collaborators in every round; set it to {n} or remove it"
        )
    if minimum < least:
        t.fail(
            f"[quorum] min_collaborators = {minimum} is below the secure-aggregation threshold {least}; "
            f"raise it to at least {least}"
        )
    if minimum < isolating:
        t.fail(
            f"[quorum] min_collaborators = {minimum} is below max_colluding + 2 = {isolating}: a round that small "
            "could leave one institution's update alone beside the colluders'; raise it"
        )
    timeout = number_in(t, "round_timeout_seconds", positive("seconds"), QuorumSettings.round_timeout_seconds)
    grace = (
        number_in(t, "grace_factor", Interval(1.0, PLAN_NUMBER_MAX, meaning="k x the median answer time"))
        if t.given("grace_factor")
        else None
    )
    allowed = t.integer("aborted_rounds_allowed", QuorumSettings.aborted_rounds_allowed, low=0)
    return QuorumSettings(minimum, timeout, grace, allowed)


def read_learning(source: str, data: Mapping[str, object], collaborators: int) -> LearningSettings:
    """The learning sections of a plan (or of shared settings) for a federation of `collaborators`."""
    secagg = _secure_aggregation(source, data, collaborators)
    schema = _schema(source, data, collaborators)
    training = read_training(source, data)
    influence = read_influence(
        source,
        data,
        collaborators,
        default_norm=default_update_norm(training),
        batch_fraction=batch_fraction(training),
        max_weight=secagg.max_weight,
    )
    evaluation = read_evaluation(source, data)
    privacy = read_plan_privacy(source, data, secagg.enabled, training.local)
    try:
        composition_columns(schema, evaluation.composition)
        if schema is not None and privacy.noised:
            statistics_release(privacy, schema)  # refuses now a numeric column without a public range
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None
    return LearningSettings(
        objective=read_objective(source, data),
        model=read_model(source, data),
        training=training,
        influence=influence,
        secure_aggregation=secagg,
        quorum=_quorum(source, data, collaborators, secagg),
        evaluation=evaluation,
        schema=schema,
        privacy=privacy,
    )


def _schema(source: str, data: Mapping[str, object], collaborators: int) -> Schema | None:
    """The plan's [schema], or None; with one, [model] features is the encoder's and may not be set."""
    section = data.get("schema")
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ConfigError(f"{source}: [schema] must be a table; see `fedfair data schema --help` to draft one")
    model = data.get("model")
    if isinstance(model, Mapping) and "features" in model:
        raise ConfigError(
            f"{source}: [model] features is set but the plan has a [schema], which decides the model's input "
            "size (numbers and one-hot categories); remove features from [model]"
        )
    if collaborators > STATISTICS_MAX_SITES:
        raise ConfigError(
            f"{source}: a plan with a [schema] allows at most {STATISTICS_MAX_SITES} collaborators (the "
            f"statistics sum must stay exact), got {collaborators}; remove [schema] and encode the data beforehand"
        )
    return Schema.from_mapping(section, source)
