"""Federation plans: the aggregator's ``plan.toml`` and a collaborator's ``collaborator.toml``.

Both are TOML files read with ``tomllib`` into frozen dataclasses. Every value is
checked (type and range); an unknown section or key is refused with the closest
known name as a suggestion. Errors are :class:`~fedfair.core.errors.ConfigError` with
one line naming the file, the section, the problem and the fix.

Relative paths in a file are relative to that file's folder, so a workspace can be
moved or copied as a whole.

The aggregator shares the learning sections of its plan with collaborators
(:func:`shared_settings` / :func:`load_shared_settings`), never the allow-list of
names or its own paths; :func:`plan_digest` fingerprints the plan for checkpoints
and for collaborators to notice a changed plan.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.pki import validate_name

# Kept in step with fedfair.core.objective.SMOOTH_PLUS_FUNCTIONS and fedfair.core.models.MODEL_NAMES
# (not imported: reading a plan should not need torch).
SMOOTH_FUNCTIONS = ("softrelu", "quadratic", "zang")
MODEL_NAMES = ("logreg", "mlp", "cnn")
_ADDRESS_RE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})")
_DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?|mps|auto")
_FEDERATION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_REQUIRED: Any = object()


# ---------------------------------------------------------------- dataclasses: shared learning settings


@dataclass(frozen=True)
class ObjectiveSettings:
    """RCVaR knobs; field names match fedfair.core.objective.ObjectiveConfig."""

    epsilon: float = 0.1
    rho: float = 0.3
    gamma: float = 0.05
    smooth: str = "softrelu"
    bound: float = 10.0


ADULT_FEATURES = 107
"""Input features of the bundled Adult data: the default model input size."""


@dataclass(frozen=True)
class ModelSettings:
    """Which model (fedfair.core.models.build_model) and its input/output sizes."""

    name: str = "logreg"
    features: int = ADULT_FEATURES
    classes: int = 2
    image_shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TrainingSettings:
    """Algorithm 1's knobs. Each collaborator's mini-batch is b_k = round(batch_fraction * n_k)
    (at least 1), so the weights w_k = b_k are proportional to n_k, as the algorithm needs,
    without any institution revealing n_k. Iterates after round average_from * rounds enter
    the averaged output, as in the simulation."""

    rounds: int = 100
    local_steps: int = 1
    batch_fraction: float = 0.01
    lr: float = 0.1
    threshold_lr: float = 0.1
    seed: int = 0
    average_from: float = 0.5


@dataclass(frozen=True)
class SecureAggregationSettings:
    """Bonawitz et al. double masking; ``neighbours = 0`` means the complete graph.

    ``threshold`` None means floor(p/2) + 1 of each round's p participants. ``max_weight``
    bounds a collaborator's weight b_k, which the fixed-point encoding must hold.
    """

    enabled: bool = True
    threshold: int | None = None
    modulus_bits: int = 64
    fractional_bits: int = 20
    clip: float = 10.0
    neighbours: int = 0
    max_weight: float = 1e6


@dataclass(frozen=True)
class QuorumSettings:
    min_collaborators: int = 2
    round_timeout_seconds: float = 300.0


@dataclass(frozen=True)
class EvaluationSettings:
    """Evaluate every N rounds (0: only after the last round)."""

    every: int = 0


@dataclass(frozen=True)
class SharedSettings:
    """What collaborators learn of the plan: the learning sections, not names or paths."""

    federation_id: str
    collaborator_count: int
    objective: ObjectiveSettings
    model: ModelSettings
    training: TrainingSettings
    secure_aggregation: SecureAggregationSettings
    quorum: QuorumSettings
    evaluation: EvaluationSettings


# ---------------------------------------------------------------- dataclasses: the two files


@dataclass(frozen=True)
class AggregatorSettings:
    """Where the aggregator listens and keeps its files (paths resolved against the plan)."""

    address: str
    name: str
    certs: Path
    output: Path


@dataclass(frozen=True)
class AggregatorPlan:
    federation_id: str
    collaborators: tuple[str, ...]
    objective: ObjectiveSettings
    model: ModelSettings
    training: TrainingSettings
    secure_aggregation: SecureAggregationSettings
    quorum: QuorumSettings
    evaluation: EvaluationSettings
    aggregator: AggregatorSettings
    source: Path


@dataclass(frozen=True)
class CertificateSettings:
    """Same field names as fedfair.runtime.transport.TlsFiles: ``TlsFiles(**asdict(settings))``."""

    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class DataSettings:
    """Either a named dataset with a partition and this institution's index, or a CSV file."""

    dataset: str | None = None
    partition: str | None = None
    index: int | None = None
    parts: int | None = None
    alpha: float | None = None
    csv: Path | None = None
    label: str | None = None
    features: tuple[str, ...] | None = None
    group: str | None = None


@dataclass(frozen=True)
class PrivacySettings:
    """DP-SGD for this collaborator (fedfair.privacy), its own choice; off by default."""

    enabled: bool = False
    noise_multiplier: float = 1.0
    target_epsilon: float | None = None
    max_grad_norm: float = 20.0
    delta: float = 1e-5
    budget_epsilon: float | None = None


@dataclass(frozen=True)
class CollaboratorConfig:
    """One institution's file. ``federation`` (optional) is the federation id it expects to
    join: with it set, the collaborator refuses an aggregator that runs another federation."""

    name: str
    aggregator: str
    aggregator_name: str | None
    device: str
    certificates: CertificateSettings
    data: DataSettings
    privacy: PrivacySettings
    source: Path
    federation: str | None = None


# ---------------------------------------------------------------- reading tables


def _shown(value: object) -> str:
    """A value as it would be written in TOML (true, "text", [1, 2])."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _suggest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f"did you mean '{close[0]}'?" if close else f"known: {', '.join(choices)}"


class _Table:
    """One TOML table, read key by key; every error names the file and the section."""

    def __init__(self, source: str, section: str, data: object, keys: tuple[str, ...]) -> None:
        self.source, self.section = source, section
        if not isinstance(data, Mapping):
            self.fail(f"[{section}] must be a table (a [{section}] header with key = value lines)")
        self.data: Mapping[str, object] = data
        for key in data:
            if key not in keys:
                self.fail(f"unknown key '{key}' in [{section}]; {_suggest(key, list(keys))}")

    def fail(self, message: str) -> None:
        raise ConfigError(f"{self.source}: {message}")

    def _value(self, key: str, default: object, expected: str) -> object:
        if key not in self.data:
            if default is _REQUIRED:
                self.fail(f"missing key '{key}' in [{self.section}]; add {key} = <{expected}>")
            return default
        return self.data[key]

    def bad(self, key: str, value: object, expected: str) -> None:
        self.fail(f"[{self.section}] {key} must be {expected}, got {_shown(value)}; fix the value")

    def integer(self, key: str, default: object = _REQUIRED, *, low: int | None = None, high: int | None = None) -> Any:
        expected = (
            "an integer" + (f" >= {low}" if low is not None else "") + (f" <= {high}" if high is not None else "")
        )
        value = self._value(key, default, expected)
        if value is None and default is None:
            return None
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or (low is not None and value < low)
            or (high is not None and value > high)
        ):
            self.bad(key, value, expected)
        return value

    def number(
        self, key: str, default: object = _REQUIRED, *, check: Callable[[float], bool] = lambda _: True, expected: str
    ) -> Any:
        value = self._value(key, default, expected)
        if value is None and default is None:
            return None
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
            or not check(value)
        ):
            self.bad(key, value, expected)
        return float(value)

    def boolean(self, key: str, default: object = _REQUIRED) -> Any:
        value = self._value(key, default, "true or false")
        if not isinstance(value, bool):
            self.bad(key, value, "true or false")
        return value

    def string(
        self,
        key: str,
        default: object = _REQUIRED,
        *,
        choices: tuple[str, ...] = (),
        pattern: re.Pattern[str] | None = None,
        expected: str = "a non-empty string",
    ) -> Any:
        if choices:
            expected = "one of " + ", ".join(f'"{choice}"' for choice in choices)
        value = self._value(key, default, expected)
        if value is None and default is None:
            return None
        if (
            not isinstance(value, str)
            or not value
            or (choices and value not in choices)
            or (pattern is not None and not pattern.fullmatch(value))
        ):
            if isinstance(value, str) and choices:
                self.fail(f"[{self.section}] {key} = {_shown(value)} is not known; {_suggest(value, list(choices))}")
            self.bad(key, value, expected)
        return value

    def strings(self, key: str, default: object = _REQUIRED) -> Any:
        value = self._value(key, default, "a list of strings")
        if value is None and default is None:
            return None
        if not isinstance(value, list) or not value or not all(isinstance(item, str) and item for item in value):
            self.bad(key, value, "a non-empty list of strings")
        return tuple(value)

    def name(self, key: str, default: object = _REQUIRED) -> Any:
        value = self.string(key, default, expected="a participant name like 'hospital-a'")
        if value is None:
            return None
        try:
            return validate_name(value)
        except ConfigError as error:
            self.fail(f"[{self.section}] {key}: {error}")

    def path(self, key: str, base: Path, default: object = _REQUIRED) -> Any:
        value = self.string(key, default, expected="a path")
        return None if value is None else (base / Path(value).expanduser()).resolve()

    def address(self, key: str, default: object = _REQUIRED) -> Any:
        value = self.string(key, default, expected='host:port, e.g. "localhost:50051"')
        match = _ADDRESS_RE.fullmatch(value)
        if match is None or not 1 <= int(match.group(2)) <= 65535:
            self.bad(key, value, 'host:port with a port in 1..65535, e.g. "localhost:50051"')
        return value


def _sections(source: str, data: Mapping[str, object], known: tuple[str, ...]) -> None:
    for section in data:
        if section not in known:
            raise ConfigError(f"{source}: unknown section [{section}]; {_suggest(section, list(known))}")


def _table(source: str, data: Mapping[str, object], section: str, keys: tuple[str, ...]) -> _Table:
    return _Table(source, section, data.get(section, {}), keys)


def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(cls))


# ---------------------------------------------------------------- the learning sections (shared)


def _objective(source: str, data: Mapping[str, object]) -> ObjectiveSettings:
    t = _table(source, data, "objective", _field_names(ObjectiveSettings))
    d = ObjectiveSettings()
    return ObjectiveSettings(
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
    t = _table(source, data, "model", _field_names(ModelSettings))
    name = t.string("name", "logreg", choices=MODEL_NAMES)
    features = t.integer("features", ADULT_FEATURES, low=1)
    classes = t.integer("classes", 2, low=2)
    shape = t._value("image_shape", None, "a list of 3 positive integers")
    if shape is not None:
        if (
            not isinstance(shape, list)
            or len(shape) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape)
        ):
            t.bad("image_shape", shape, "a list of 3 positive integers [channels, height, width]")
        if math.prod(shape) != features:
            t.fail(
                f"[model] image_shape = {shape} holds {math.prod(shape)} values but features = {features}; make them agree"
            )
        shape = tuple(shape)
    if name == "cnn" and shape is None:
        t.fail('[model] name = "cnn" needs image_shape = [channels, height, width]; add it or use "logreg" / "mlp"')
    return ModelSettings(name=name, features=features, classes=classes, image_shape=shape)


def _training(source: str, data: Mapping[str, object]) -> TrainingSettings:
    t = _table(source, data, "training", _field_names(TrainingSettings))
    d = TrainingSettings()
    positive: dict[str, Any] = {"check": lambda x: x > 0, "expected": "a number > 0"}
    return TrainingSettings(
        rounds=t.integer("rounds", d.rounds, low=1),
        local_steps=t.integer("local_steps", d.local_steps, low=1),
        batch_fraction=t.number(
            "batch_fraction",
            d.batch_fraction,
            check=lambda x: 0 < x <= 1,
            expected="a number in (0, 1] (each collaborator's batch is round(batch_fraction * n_k))",
        ),
        lr=t.number("lr", d.lr, **positive),
        threshold_lr=t.number("threshold_lr", d.threshold_lr, **positive),
        seed=t.integer("seed", d.seed, low=0),
        average_from=t.number(
            "average_from",
            d.average_from,
            check=lambda x: 0 <= x < 1,
            expected="a number in [0, 1) (the fraction of rounds before iterates enter the average)",
        ),
    )


def _secure_aggregation(source: str, data: Mapping[str, object], n: int) -> SecureAggregationSettings:
    t = _table(source, data, "secure_aggregation", _field_names(SecureAggregationSettings))
    d = SecureAggregationSettings()
    enabled = t.boolean("enabled", d.enabled)
    if enabled and n < 2:
        t.fail(
            "[secure_aggregation] needs at least 2 collaborators to hide anyone's update; "
            "add collaborators or set enabled = false"
        )
    threshold = t.integer("threshold", None, low=2)
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
    return SecureAggregationSettings(enabled, threshold, modulus_bits, fractional_bits, clip, neighbours, max_weight)


def _quorum(source: str, data: Mapping[str, object], n: int, secagg: SecureAggregationSettings) -> QuorumSettings:
    t = _table(source, data, "quorum", _field_names(QuorumSettings))
    if not secagg.enabled:
        least = default = 1
    elif secagg.threshold is not None:
        least = default = secagg.threshold
    else:
        # Secure aggregation needs two parties; by default a majority of the plan takes part.
        least, default = 2, max(2, n // 2 + 1)
    minimum = t.integer("min_collaborators", default, low=1)
    if minimum > n:
        t.fail(f"[quorum] min_collaborators = {minimum} exceeds the {n} collaborators; lower it")
    if minimum < least:
        t.fail(
            f"[quorum] min_collaborators = {minimum} is below the secure-aggregation threshold {least}; "
            f"raise it to at least {least}"
        )
    timeout = t.number(
        "round_timeout_seconds",
        QuorumSettings.round_timeout_seconds,
        check=lambda x: x > 0,
        expected="a number of seconds > 0",
    )
    return QuorumSettings(minimum, timeout)


def _evaluation(source: str, data: Mapping[str, object]) -> EvaluationSettings:
    t = _table(source, data, "evaluation", _field_names(EvaluationSettings))
    return EvaluationSettings(every=t.integer("every", EvaluationSettings.every, low=0))


_LEARNING_SECTIONS = ("objective", "model", "training", "secure_aggregation", "quorum", "evaluation")


def _learning(source: str, data: Mapping[str, object], n: int) -> dict[str, Any]:
    secagg = _secure_aggregation(source, data, n)
    return {
        "objective": _objective(source, data),
        "model": _model(source, data),
        "training": _training(source, data),
        "secure_aggregation": secagg,
        "quorum": _quorum(source, data, n, secagg),
        "evaluation": _evaluation(source, data),
    }


# ---------------------------------------------------------------- loading files


def _read_toml(path: Path | str) -> tuple[Path, dict[str, Any]]:
    path = Path(path)
    try:
        with path.open("rb") as handle:
            return path.resolve(), tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path} not found; copy the template next to it and edit it") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML ({error}); fix the syntax") from None


def parse_aggregator_plan(data: Mapping[str, Any], source: Path) -> AggregatorPlan:
    """Validate an aggregator plan already read from TOML (``source`` for messages and paths)."""
    where = str(source)
    _sections(where, data, ("federation", "aggregator", *_LEARNING_SECTIONS))
    federation = _table(where, data, "federation", ("id", "collaborators"))
    federation_id = federation.string("id", pattern=_FEDERATION_ID_RE, expected="letters, digits, '.', '_' or '-'")
    names = federation.strings("collaborators")
    for name in names:
        try:
            validate_name(name)
        except ConfigError as error:
            federation.fail(f"[federation] collaborators: {error}")
    if len(set(names)) != len(names):
        federation.fail("[federation] collaborators lists a name twice; list each institution once")
    node = _table(where, data, "aggregator", _field_names(AggregatorSettings))
    base = source.parent
    aggregator = AggregatorSettings(
        address=node.address("address", "0.0.0.0:50051"),
        name=node.name("name", "aggregator"),
        certs=node.path("certs", base, "../certs"),
        output=node.path("output", base, "output"),
    )
    if aggregator.name in names:
        node.fail(f"[aggregator] name {aggregator.name!r} is also a collaborator; give the aggregator its own name")
    return AggregatorPlan(
        federation_id=federation_id,
        collaborators=names,
        aggregator=aggregator,
        source=source,
        **_learning(where, data, len(names)),
    )


def load_aggregator_plan(
    path: Path | str | None, overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> AggregatorPlan:
    """Read and validate ``aggregator/plan.toml``.

    ``overrides`` maps section -> key -> value and replaces the file's values before
    validation (command-line flags), so overridden values get the same checks. With
    ``path`` None the plan is the defaults plus the overrides, and relative paths are
    relative to the current folder.
    """
    if path is None:
        source, data = Path.cwd() / "(command-line plan)", {}
    else:
        source, data = _read_toml(path)
    for section, values in (overrides or {}).items():
        table = data.setdefault(section, {})
        if isinstance(table, dict):
            table.update(values)
    return parse_aggregator_plan(data, source)


def parse_collaborator_config(data: Mapping[str, Any], source: Path) -> CollaboratorConfig:
    """Validate a collaborator config already read from TOML."""
    where = str(source)
    base = source.parent
    _sections(where, data, ("collaborator", "certificates", "data", "privacy"))
    me = _table(where, data, "collaborator", ("name", "aggregator", "aggregator_name", "device", "federation"))
    name = me.name("name")
    federation = me.string(
        "federation", None, pattern=_FEDERATION_ID_RE, expected="a federation id (letters, digits, '.', '_' or '-')"
    )
    aggregator = me.address("aggregator")
    aggregator_name = me.name("aggregator_name", None)
    device = me.string("device", "auto", pattern=_DEVICE_RE, expected='"cpu", "cuda", "cuda:N", "mps" or "auto"')

    tls = _table(where, data, "certificates", ("dir", "ca", "cert", "key"))
    folder = tls.path("dir", base, "certs")
    certificates = CertificateSettings(
        ca=tls.path("ca", folder, "ca.crt"),
        cert=tls.path("cert", folder, f"{name}.crt"),
        key=tls.path("key", folder, f"{name}.key"),
    )
    return CollaboratorConfig(
        name=name,
        aggregator=aggregator,
        aggregator_name=aggregator_name,
        device=device,
        certificates=certificates,
        data=_data(where, data, base),
        privacy=_privacy(where, data),
        source=source,
        federation=federation,
    )


def _data(source: str, data: Mapping[str, object], base: Path) -> DataSettings:
    t = _table(source, data, "data", _field_names(DataSettings))
    dataset = t.string("dataset", None)
    csv = t.path("csv", base, None)
    if (dataset is None) == (csv is None):
        t.fail(
            '[data] needs exactly one source: dataset = "adult" (with partition and index) or csv = "path.csv" (with label)'
        )
    if dataset is not None:
        for key in ("label", "features", "group"):
            if key in t.data:
                t.fail(f"[data] {key} applies to csv files only; remove it or use csv = ...")
        index = t.integer("index", low=0)
        parts = t.integer("parts", None, low=1)
        if parts is not None and index >= parts:
            t.fail(f"[data] index = {index} must be below parts = {parts}; indices count from 0")
        return DataSettings(
            dataset=dataset,
            partition=t.string("partition", None),
            index=index,
            parts=parts,
            alpha=t.number("alpha", None, check=lambda x: x > 0, expected="a number > 0 (Dirichlet concentration)"),
        )
    for key in ("partition", "index", "parts", "alpha"):
        if key in t.data:
            t.fail(f"[data] {key} applies to named datasets only; a csv file is this institution's data as a whole")
    return DataSettings(
        csv=csv, label=t.string("label"), features=t.strings("features", None), group=t.string("group", None)
    )


def _privacy(source: str, data: Mapping[str, object]) -> PrivacySettings:
    t = _table(source, data, "privacy", _field_names(PrivacySettings))
    d = PrivacySettings()
    positive: dict[str, Any] = {"check": lambda x: x > 0, "expected": "a number > 0"}
    return PrivacySettings(
        enabled=t.boolean("enabled", d.enabled),
        noise_multiplier=t.number(
            "noise_multiplier", d.noise_multiplier, check=lambda x: x >= 0, expected="a number >= 0"
        ),
        target_epsilon=t.number("target_epsilon", None, **positive),
        max_grad_norm=t.number("max_grad_norm", d.max_grad_norm, **positive),
        delta=t.number("delta", d.delta, check=lambda x: 0 < x < 1, expected="a number in (0, 1)"),
        budget_epsilon=t.number("budget_epsilon", None, **positive),
    )


def load_collaborator_config(path: Path | str) -> CollaboratorConfig:
    """Read and validate ``collaborator/collaborator.toml``."""
    source, data = _read_toml(path)
    return parse_collaborator_config(data, source)


# ---------------------------------------------------------------- sharing and fingerprints


def _plain(value: Any) -> Any:
    """Dataclass -> JSON-able dict (tuples as lists, no paths)."""
    return json.loads(json.dumps(dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value))


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def shared_settings(plan: AggregatorPlan) -> bytes:
    """Canonical JSON of what collaborators need (PlanReply.settings): no names, no paths."""
    content = {section: _plain(getattr(plan, section)) for section in _LEARNING_SECTIONS}
    content["federation"] = {"id": plan.federation_id, "collaborator_count": len(plan.collaborators)}
    return _canonical(content)


def load_shared_settings(payload: bytes, source: str = "the aggregator's plan") -> SharedSettings:
    """Parse and re-validate PlanReply.settings on the collaborator's side."""
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ConfigError(f"{source}: not valid JSON; the aggregator and collaborator versions may differ") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object; the aggregator and collaborator versions may differ")
    _sections(source, data, ("federation", *_LEARNING_SECTIONS))
    federation = _Table(source, "federation", data.get("federation", {}), ("id", "collaborator_count"))
    count = federation.integer("collaborator_count", low=1)
    return SharedSettings(
        federation_id=federation.string("id", pattern=_FEDERATION_ID_RE),
        collaborator_count=count,
        **_learning(source, data, count),
    )


def plan_digest(plan: AggregatorPlan) -> str:
    """sha256 (hex) of the plan's canonical content: federation id, allowed names and the
    learning sections. Deployment details (address, folders) are left out, so a moved
    workspace still resumes from its checkpoints."""
    content = {section: _plain(getattr(plan, section)) for section in _LEARNING_SECTIONS}
    content["federation"] = {"id": plan.federation_id, "collaborators": list(plan.collaborators)}
    return hashlib.sha256(_canonical(content)).hexdigest()
