"""The plan's learning settings: the sections the aggregator shares with every collaborator.

``[objective]`` is read straight into the learning core's
:class:`~fedfair.core.config.ObjectiveConfig`. The other sections feed several core
objects, so each has a frozen dataclass here with exactly one converter per object
it feeds (:meth:`TrainingSettings.local_config`, :meth:`SecureAggregationSettings.encoding`,
:meth:`ModelSettings.build`, :meth:`EvaluationSettings.thresholds`): nowhere else is a
setting copied field by field.

The readers check every value (type and range) with :class:`~fedfair.runtime.toml_tables.Table`,
the same way for the aggregator's TOML plan and for the JSON a collaborator receives.
Reading settings needs neither torch nor gRPC.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedfair.core.config import (
    DRIFT_CORRECTIONS,
    MODEL_NAMES,
    SMOOTH_FUNCTIONS,
    LocalConfig,
    ObjectiveConfig,
)
from fedfair.core.errors import ConfigError
from fedfair.datasets.schema import STATISTICS_MAX_SITES, Schema
from fedfair.fairness import sums
from fedfair.pki.names import validate_name
from fedfair.runtime.toml_tables import Table, field_names
from fedfair.secagg import EncodingConfig, check_threshold, threshold_for

if TYPE_CHECKING:
    import numpy as np
    from torch import nn

WEIGHTINGS = ("equal", "declared")
"""[influence] weights: every institution counts the same, or by the size the plan declares for it."""

DROPOUT_POLICIES = ("allowed", "none")
"""[secure_aggregation] dropouts: whether a round may finish without some collaborators."""

ADULT_FEATURES = 107
"""Input features of the bundled Adult data: the default model input size."""


@dataclass(frozen=True)
class ModelSettings:
    """Which model, and the data's input/output sizes every collaborator's table must have.

    A built-in model is `name` (fedfair.core.models.build_model). An institution's own
    architecture is `factory`, "package.module:function", called with `arguments` (a
    table of JSON values) under the plan's seed; `name` then repeats the factory's path,
    so that it always names the architecture. Every party must have that package
    installed and allowed in its own configuration (``allowed``: nothing in a plan that
    arrived over the wire is ever imported); the aggregator builds the model only to learn
    its parameter shapes.
    """

    name: str = "logreg"
    features: int = ADULT_FEATURES
    classes: int = 2
    image_shape: tuple[int, ...] | None = None
    factory: str | None = None
    # Left out of the hash: a table is not hashable, and equal settings still compare equal.
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def build(self, seed: int = 0, *, allowed: Collection[str] = ()) -> nn.Module:
        """The model with `seed`'s initial weights (the plan's seed gives every side the same theta_0);
        a factory is built only if `allowed`, this party's own list, names it."""
        # Imported here: reading a plan must not need torch, only building its model does.
        from fedfair.core.models import build_from_factory, build_model

        if self.factory is not None:
            return build_from_factory(self.factory, self.arguments, allowed=allowed, seed=seed)
        return build_model(self.name, self.features, self.classes, image_shape=self.image_shape, seed=seed)


@dataclass(frozen=True)
class TrainingSettings:
    """Algorithm 1's knobs. Each collaborator's mini-batch is b_k = round(batch_fraction * n_k)
    (at least 1), so the weights w_k = b_k are proportional to n_k, as the algorithm needs,
    without any institution revealing n_k. The output averages the pairs rounds
    average_from * rounds + 1 .. rounds start from (average_from = 0: all of them, Algorithm 1's
    theta-bar), as in the simulation; c is projected at the server only, as Algorithm 1 does.

    `drift_correction` "scaffold" adds SCAFFOLD control variates for (theta, c) (fedfair.core.local):
    the server's sigma travels down with (theta, c) and each collaborator's sigma_k+ up inside the
    same summed vector, which is then 2 (d + 1) long; "none" is plain FedSRCVaR."""

    rounds: int = 100
    local_steps: int = 1
    batch_fraction: float = 0.01
    lr: float = 0.1
    threshold_lr: float = 0.1
    seed: int = 0
    average_from: float = 0.5
    drift_correction: str = "none"

    def local_config(self) -> LocalConfig:
        """How each collaborator trains within a round (the learning core's LocalConfig)."""
        return LocalConfig(
            local_steps=self.local_steps,
            lr=self.lr,
            threshold_lr=self.threshold_lr,
            drift_correction=self.drift_correction,
        )

    @property
    def corrects_drift(self) -> bool:
        """Whether rounds carry control variates: the server's sigma down, each sigma_k+ up in the sum."""
        return self.drift_correction != "none"

    @property
    def average_from_round(self) -> int:
        """`server.apply`'s average_from: the pairs later rounds start from enter the averaged output."""
        return int(self.average_from * self.rounds)


@dataclass(frozen=True)
class InfluenceSettings:
    """How far one institution can move the model in a round: a weight agreed in the plan, never
    claimed, and an L2 bound on its update.

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
    that does not set it gets 2 * lr * local_steps (:func:`default_update_norm`).
    """

    weights: str = "equal"
    # Left out of the hash like ModelSettings.arguments: a table is not hashable.
    sizes: dict[str, int] = dataclasses.field(default_factory=dict, hash=False)
    update_norm: float = 2.0 * TrainingSettings.lr * TrainingSettings.local_steps  # default_update_norm's

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

    def total_weight(self, names: Collection[str], batch_fraction: float) -> float:
        """The agreed total weight of a round's contributors: what the server divides their sum by."""
        return math.fsum(self.weight_of(name, batch_fraction) for name in names)


def default_update_norm(training: TrainingSettings) -> float:
    """C when the plan sets none: 2 * lr * local_steps, twice the distance tau SGD steps of gradient
    norm 1 go. Honest FedSRCVaR updates on Adult measured 0.9 lr tau (median) at 1 and 5 local steps,
    so this clips almost none of them; a tighter C bounds a liar more and slows honest training
    (benchmarks/influence_bench.py)."""
    return 2.0 * training.lr * training.local_steps


def declared_batch(size: int, batch_fraction: float) -> int:
    """b_k = round(batch_fraction * n_k), at least 1: core.data.local_batch_size of a declared size."""
    return max(round(batch_fraction * size), 1)


@dataclass(frozen=True)
class SecureAggregationSettings:
    """Bonawitz et al. double masking; ``neighbours = 0`` means the complete graph.

    ``threshold`` None means the smallest t the threshold rule allows for each round's p
    participants (fedfair.secagg.threshold_for: floor(p/2) + 1 when max_colluding is 0).
    ``max_weight`` bounds a collaborator's weight b_k, which the fixed-point encoding must
    hold. ``max_colluding`` is the collusion bound the federation assumes: how many
    collaborators may pool what they know with the aggregator. The plan is refused unless
    the threshold satisfies the rule for the full roster (fedfair.secagg.check_threshold)
    and the quorum keeps at least two honest inputs beside the colluders (max_colluding + 2).

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
    neighbours: int = 0
    max_weight: float = 1e6
    max_colluding: int = 0
    dropouts: str = "allowed"

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

    @property
    def mask_neighbours(self) -> int | None:
        """The masking graph's degree as the secure-aggregation library takes it (None: complete)."""
        return self.neighbours or None


@dataclass(frozen=True)
class QuorumSettings:
    """How many collaborators a round needs, and how long each stage waits for them."""

    min_collaborators: int = 2
    round_timeout_seconds: float = 300.0


@dataclass(frozen=True)
class EvaluationSettings:
    """Evaluate every N rounds (0: only after the last round), on thresholds the plan fixes.

    ``loss_range`` is where half of the evaluation's thresholds lie, evenly spaced
    (fedfair.fairness.sums): the same grid for every evaluation of the federation,
    computed by each side from its own copy of the plan. ``min_bucket_count`` is the
    fewest held-out samples a reported group risk may rest on.
    """

    every: int = 0
    loss_range: tuple[float, float] = sums.LOSS_RANGE
    min_bucket_count: int = sums.MIN_BUCKET_COUNT

    def thresholds(self) -> np.ndarray:
        """The evaluation's thresholds (fedfair.fairness.sums.threshold_grid of the loss range)."""
        return sums.threshold_grid(self.loss_range)


@dataclass(frozen=True)
class LearningSettings:
    """The plan's learning sections: everything collaborators learn of the plan besides its id."""

    objective: ObjectiveConfig
    model: ModelSettings
    training: TrainingSettings
    influence: InfluenceSettings
    secure_aggregation: SecureAggregationSettings
    quorum: QuorumSettings
    evaluation: EvaluationSettings
    schema: Schema | None
    """The federation's table ([schema]): columns, categories, missing values. With one, every
    collaborator encodes its own table with statistics of all tables together (fedfair.runtime.
    preprocessing) and the model's input size is the encoder's; without one, collaborators bring
    data already encoded to the plan's [model] features."""

    def learning_sections(self) -> dict[str, Any]:
        """The sections by name (to build a plan from them, or to share them); schema may be None."""
        return {name: getattr(self, name) for name in LEARNING_SECTIONS}


LEARNING_SECTIONS = tuple(field.name for field in dataclasses.fields(LearningSettings))


# ---------------------------------------------------------------- reading the sections


def _objective(source: str, data: Mapping[str, object]) -> ObjectiveConfig:
    t = Table.of(source, data, "objective", field_names(ObjectiveConfig))
    d = ObjectiveConfig()
    return ObjectiveConfig(
        epsilon=t.number(
            "epsilon", d.epsilon, check=lambda x: 0 <= x <= 1, expected="a number in [0, 1] (1 = ERM, 0 = CVaR)"
        ),
        rho=t.number(
            "rho", d.rho, check=lambda x: 0 < x <= 1, expected="a number in (0, 1] (the smallest group protected)"
        ),
        gamma=t.number("gamma", d.gamma, check=lambda x: x > 0, expected="a number > 0 (the smoothing width)"),
        smooth=t.string("smooth", d.smooth, choices=SMOOTH_FUNCTIONS),
        bound=t.number("bound", d.bound, check=lambda x: x > 0, expected="a number > 0 (the cap B on the threshold c)"),
    )


def _model(source: str, data: Mapping[str, object]) -> ModelSettings:
    t = Table.of(source, data, "model", field_names(ModelSettings))
    d = ModelSettings()
    factory: str | None = None
    arguments: dict[str, Any] = {}
    if t.given("factory"):
        # Its form and presence are checked where it is imported (fedfair.core.models.load_factory), which
        # the aggregator does on start: reading a plan needs no torch and runs no user code.
        factory = t.string("factory", expected='"package.module:function", e.g. "mymodels:build"')
        # Shared settings repeat the factory as the name; a plan may leave the name out.
        name = t.string("name", factory)
        if name != factory:
            t.fail(
                f'[model] names both name = "{name}" and factory = "{factory}"; keep one: '
                "name for a built-in model, factory for your own"
            )
        if t.given("arguments"):
            arguments = _json_table(t, "arguments")
    else:
        name = t.string("name", d.name, choices=MODEL_NAMES)
        if t.given("arguments") and t.data["arguments"] != {}:
            t.fail('[model] arguments apply to a model factory only; add factory = "package.module:function" or drop them')
    features = t.integer("features", d.features, low=1)
    classes = t.integer("classes", d.classes, low=2)
    shape: tuple[int, ...] | None = None
    if t.given("image_shape"):
        value = t.data["image_shape"]
        if not isinstance(value, list) or len(value) != 3 or not all(_positive_integer(x) for x in value):
            t.bad("image_shape", value, "a list of 3 positive integers [channels, height, width]")
        shape = tuple(value)
        if math.prod(shape) != features:
            t.fail(
                f"[model] image_shape = {value} holds {math.prod(shape)} values but features = {features}; make them agree"
            )
    if name == "cnn" and shape is None:
        t.fail('[model] name = "cnn" needs image_shape = [channels, height, width]; add it or use "logreg" / "mlp"')
    return ModelSettings(
        name=name, features=features, classes=classes, image_shape=shape, factory=factory, arguments=arguments
    )


def _positive_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _json_value(value: object) -> bool:
    """Whether `value` survives the trip to JSON and back unchanged (what every party receives)."""
    if isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_json_value(item) for item in value)
    if isinstance(value, Mapping):
        return all(isinstance(key, str) and _json_value(item) for key, item in value.items())
    return False


def _json_table(t: Table, key: str) -> dict[str, Any]:
    """A table of JSON values (strings, numbers, booleans, lists, tables): a factory's keyword arguments."""
    value = t.data[key]
    if not isinstance(value, Mapping) or not _json_value(value):
        t.bad(key, value, "a table of strings, finite numbers, booleans, lists and tables, e.g. { hidden = 64 }")
    return dict(value)


def _training(source: str, data: Mapping[str, object]) -> TrainingSettings:
    t = Table.of(source, data, "training", field_names(TrainingSettings))
    d = TrainingSettings()
    return TrainingSettings(
        rounds=t.integer("rounds", d.rounds, low=1),
        local_steps=t.integer("local_steps", d.local_steps, low=1),
        batch_fraction=t.number(
            "batch_fraction",
            d.batch_fraction,
            check=lambda x: 0 < x <= 1,
            expected="a number in (0, 1] (each collaborator's batch is round(batch_fraction * n_k))",
        ),
        lr=t.number("lr", d.lr, check=lambda x: x > 0, expected="a number > 0"),
        threshold_lr=t.number("threshold_lr", d.threshold_lr, check=lambda x: x > 0, expected="a number > 0"),
        seed=t.integer("seed", d.seed, low=0),
        average_from=t.number(
            "average_from",
            d.average_from,
            check=lambda x: 0 <= x < 1,
            expected="a number in [0, 1) (the fraction of rounds before iterates enter the average)",
        ),
        drift_correction=t.string("drift_correction", d.drift_correction, choices=DRIFT_CORRECTIONS),
    )


def _influence(source: str, data: Mapping[str, object], n: int, training: TrainingSettings) -> InfluenceSettings:
    t = Table.of(source, data, "influence", field_names(InfluenceSettings))
    d = InfluenceSettings()
    weights = t.string("weights", d.weights, choices=WEIGHTINGS)
    sizes: dict[str, int] = {}
    if t.given("sizes") and t.data["sizes"] != {}:
        value = t.data["sizes"]
        expected = "a table of institution = rows, e.g. { hospital-a = 1621, hospital-b = 774 }"
        if not isinstance(value, Mapping) or not all(_positive_integer(rows) for rows in value.values()):
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
    update_norm = t.number(
        "update_norm",
        default_update_norm(training),
        check=lambda x: x > 0,
        expected="a number > 0 (the L2 bound on each institution's round update)",
    )
    return InfluenceSettings(weights=weights, sizes=sizes, update_norm=update_norm)


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
    modulus_bits = t.integer("modulus_bits", d.modulus_bits, low=16, high=64)
    fractional_bits = t.integer("fractional_bits", d.fractional_bits, low=0)
    if fractional_bits >= modulus_bits:
        t.fail(
            f"[secure_aggregation] fractional_bits = {fractional_bits} must be below modulus_bits = {modulus_bits}; lower it"
        )
    clip = t.number("clip", d.clip, check=lambda x: x > 0, expected="a number > 0 (the bound on each coordinate)")
    neighbours = t.integer("neighbours", d.neighbours, low=0)
    if neighbours and not 2 <= neighbours <= n - 1:
        t.fail(
            f"[secure_aggregation] neighbours = {neighbours} must be 0 (complete graph) or in 2..{n - 1}; fix the value"
        )
    max_weight = t.number(
        "max_weight", d.max_weight, check=lambda x: x >= 1, expected="a number >= 1 (the largest batch b_k)"
    )
    max_colluding = t.integer("max_colluding", d.max_colluding, low=0)
    dropouts = t.string("dropouts", d.dropouts, choices=DROPOUT_POLICIES)
    if enabled:
        # The threshold rule for the full roster: m holders of each secret, up to c colluders.
        holders = neighbours + 1 if neighbours else n
        try:
            if threshold is None:
                threshold_for(holders, max_colluding)
            else:
                check_threshold(threshold, holders, max_colluding)
        except ConfigError as error:
            t.fail(f"[secure_aggregation] with {n} collaborators and max_colluding = {max_colluding}: {error}")
    return SecureAggregationSettings(
        enabled, threshold, modulus_bits, fractional_bits, clip, neighbours, max_weight, max_colluding, dropouts
    )


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
    timeout = t.number(
        "round_timeout_seconds",
        QuorumSettings.round_timeout_seconds,
        check=lambda x: x > 0,
        expected="a number of seconds > 0",
    )
    return QuorumSettings(minimum, timeout)


def _evaluation(source: str, data: Mapping[str, object]) -> EvaluationSettings:
    t = Table.of(source, data, "evaluation", field_names(EvaluationSettings))
    d = EvaluationSettings()
    loss_range = d.loss_range
    if t.given("loss_range"):
        value = t.data["loss_range"]
        expected = "a list of two numbers [low, high], e.g. [0.0, 3.0]"
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
        ):
            t.bad("loss_range", value, expected)
        try:
            loss_range = sums.check_loss_range((value[0], value[1]))
        except ConfigError as error:
            t.fail(f"[evaluation] loss_range: {error}")
    return EvaluationSettings(
        every=t.integer("every", d.every, low=0),
        loss_range=loss_range,
        min_bucket_count=t.integer("min_bucket_count", d.min_bucket_count, low=1),
    )


def read_learning(source: str, data: Mapping[str, object], collaborators: int) -> LearningSettings:
    """The learning sections of a plan (or of shared settings) for a federation of `collaborators`."""
    secagg = _secure_aggregation(source, data, collaborators)
    schema = _schema(source, data, collaborators)
    training = _training(source, data)
    influence = _influence(source, data, collaborators, training)
    if influence.weights == "declared":
        heaviest = max(influence.sizes.values())
        if declared_batch(heaviest, training.batch_fraction) > secagg.max_weight:
            raise ConfigError(
                f"{source}: [influence] sizes give a weight of {declared_batch(heaviest, training.batch_fraction)}, "
                f"above [secure_aggregation] max_weight = {secagg.max_weight:g}; raise max_weight"
            )
    return LearningSettings(
        objective=_objective(source, data),
        model=_model(source, data),
        training=training,
        influence=influence,
        secure_aggregation=secagg,
        quorum=_quorum(source, data, collaborators, secagg),
        evaluation=_evaluation(source, data),
        schema=schema,
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
