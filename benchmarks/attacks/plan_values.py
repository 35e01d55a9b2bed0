"""Noise that holds for every accepted plan, and every odd plan number a named error (issue 51, items 3 and 8).

- noise floor: a ten-site plan with ``[secure_aggregation] neighbours = 9`` (every other site: the protocol
  runs it as the complete graph of each round), no colluders, quorum 2 and ``[privacy] mode = "distributed"``
  at epsilon 1. A round of three parties where one drops before masking unmasks with two contributors; each
  encodes the plan's training noise exactly as a collaborator derives it from the served plan
  (``SharedSettings.training_encoding``) and the round runs through the real secure-aggregation protocol
  (:func:`fedfair.secagg.simulate_round`). The decoded noise's variance, over a few thousand coordinates and a
  few rounds, must be at least 0.95 of what the ledger charges for (the release's mu); the control encodes
  the share the plan took before (a floor of six survivors) and must show the shortfall;
- odd plan values: every numeric field of a plan that sets them all, each replaced by a fixed list of odd
  values (huge, negative, non-finite, wrongly typed), read by the collaborator's
  :func:`~fedfair.runtime.plan.aggregator_plan.load_shared_settings`: every one a ConfigError naming the field;
- served to a process: fedfair's aggregator serving a plan with a 400-digit ``[training] local_steps`` to a
  real ``fedfair collaborator start`` holding the pinned manifest, and a 400-digit ``[influence]`` size to one
  without a manifest: each exits with status 2 and ``plan-mismatch`` naming the field, no traceback; served
  the genuine plan the same process joins (the control).
"""

from __future__ import annotations

import copy
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from attacks.pinned_federation import short, wait_until
from attacks.federation import plan_sections
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from attacks.waits import served
from fedfair.core.errors import ConfigError
from fedfair.runtime.local.processes import Child, child_environment, collaborator_command
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import (
    load_aggregator_plan,
    load_shared_settings,
    shared_content,
    shared_settings,
)
from fedfair.runtime.plan.privacy import answer_release, party_mu
from fedfair.secagg import DropOut, SecAggConfig, Stage, simulate_round
from fedfair.secagg.training_noise import noised_encoding

SITES = tuple(f"site-{index:02d}" for index in range(10))
FLOOR_PLAN: dict[str, dict[str, Any]] = {
    "federation": {"id": "floor", "collaborators": list(SITES)},
    "training": {"rounds": 10, "local_steps": 1, "batch_fraction": 0.01},
    "secure_aggregation": {"neighbours": len(SITES) - 1, "max_colluding": 0},
    "quorum": {"min_collaborators": 2},
    "privacy": {"mode": "distributed", "epsilon": 1.0, "report_epsilon": 1.0},
}
"""Issue 51's plan: ten sites, a degree of every other site, no colluders, quorum 2, distributed DP at epsilon 1."""
FORMER_FLOOR = 6
"""The floor that plan took before: t for ten holders of each secret, though each round has its own size."""
DIMENSION = 4000
"""Coordinates of the update each party encodes (rotated, padded to 4,096): samples of the noise per round."""
ROUNDS = 5
ENOUGH = 0.95
"""The decoded noise must carry at least this share of the variance the ledger charges for."""

ODD_VALUES: tuple[object, ...] = (
    10**400,
    -(10**400),
    2**64,
    -1,
    1e308,
    -1e308,
    math.inf,
    -math.inf,
    math.nan,
    "1",
    True,
    [1],
    {"a": 1},
)
"""Odd values for every numeric field: huge, negative, non-finite, the wrong type."""
FULL_PLAN: dict[str, dict[str, Any]] = {
    "federation": {"id": "odd", "collaborators": ["a", "b", "c"]},
    "influence": {"weights": "declared", "sizes": {"a": 1000, "b": 800, "c": 500}},
    "secure_aggregation": {"threshold": 2},
    "quorum": {"grace_factor": 3.0},
    "training": {"local_steps": 1},
    "privacy": {"mode": "distributed", "epsilon": 3.0, "report_epsilon": 1.0, "interim_report_epsilon": 0.5},
    "schema": {
        "label": "income",
        "classes": ["<=50K", ">50K"],
        "columns": [
            {"name": "age", "type": "numeric", "range": [0.0, 120.0]},
            {"name": "sector", "type": "categorical", "categories": "learn"},
        ],
    },
}
"""A plan that sets every optional number, so that every numeric field of a plan is served."""
SIGNED_FIELDS = {("schema", "columns", 0, "range", 0)}
"""Fields where a negative number is a valid value (a range's low end), so no odd value."""


def is_odd(path: tuple[str | int, ...], value: object) -> bool:
    """Whether `value` is odd at `path`: all but a negative number within max_abs where negatives are valid."""
    legal = isinstance(value, int | float) and not isinstance(value, bool) and -1e9 <= value < 0
    return not (path in SIGNED_FIELDS and legal)


HUGE = 10**400
PROCESS_SECONDS = 120.0


def plan_values_rows(root: Path, book: RowBook) -> None:
    """The rows of this module, in order."""
    noise_floor_row(book)
    odd_values_row(book)
    served_rows(root, book)


# ---------------------------------------------------------------- noise floor (item 3)


def decoded_variance_ratio(share: float | None, rounds: int = ROUNDS) -> tuple[float, int, int]:
    """The decoded noise's variance over what the ledger charges for, in three-party rounds with one dropout.

    `share` None: each party's Skellam share as the collaborator derives it from the served plan; else that
    share instead (the control). Returns the ratio, the noise samples and the contributors of each sum.
    """
    shared = load_shared_settings(shared_settings(load_aggregator_plan(None, FLOOR_PLAN)))
    secure = shared.secure_aggregation
    noise, _ = shared.training_noise(len(SITES), DIMENSION)
    assumed = 2.0 * noise.release.mu / math.ldexp(1.0, 2 * noise.fractional_bits)
    squares, samples, contributors = 0.0, 0, 0
    for round_number in range(1, rounds + 1):
        encoding = shared.training_encoding(shared.federation_id, len(SITES), round_number, DIMENSION)
        if share is not None:
            encoding = noised_encoding(secure.encoding(), noise, share, shared.federation_id, round_number, DIMENSION)
        assert encoding.noise is not None
        config = SecAggConfig(
            shared.federation_id,
            round_number,
            SITES[:3],
            encoding.noise.encoded_dimension,
            encoding,
            secure.threshold,
            secure.mask_neighbours(len(SITES)),
            secure.max_colluding,
            SITES,
        )
        zeros = np.zeros(DIMENSION)
        # The third party shares its keys, then drops before masking: the sum holds two inputs.
        result = simulate_round(
            config, lambda party: config.encoder.encode(zeros, 1.0), DropOut({Stage.MASK: [3]})
        ).result
        contributors = len(result.contributors)
        noise_values = result.decoded.weighted_sum  # every input is zero: what is decoded is the noise
        squares += float(np.sum(noise_values**2))
        samples += noise_values.size
    return squares / samples / assumed, samples, contributors


def noise_floor_row(book: RowBook) -> None:
    with book.row(
        "noise floor: a plan of 10 sites with [secure_aggregation] neighbours = 9, max_colluding 0, quorum 2, "
        "[privacy] mode distributed at epsilon 1; a 3-party round where one party drops before masking is "
        "unmasked with 2 contributors, each adding the noise share it derives from the served plan",
        f"the decoded noise variance is at least {ENOUGH} of what the ledger charges for (the release's mu), "
        f"evaluation answers on the same floor; the control, each party adding the share of the former floor of "
        f"{FORMER_FLOOR}, shows the shortfall",
        "the real secure-aggregation protocol in process (fedfair.secagg.simulate_round)",
    ) as row:
        shared = load_shared_settings(shared_settings(load_aggregator_plan(None, FLOOR_PLAN)))
        floor = shared.survivor_floor(len(SITES))
        ratio, samples, contributors = decoded_variance_ratio(None)
        noise, _ = shared.training_noise(len(SITES), DIMENSION)
        former, _, _ = decoded_variance_ratio(noise.release.mu / FORMER_FLOOR)
        # The variance of a sample variance of n near-Gaussian values is 2 sigma^4 / n.
        half = 1.96 * math.sqrt(2.0 / samples)
        release = answer_release(shared.privacy, ())
        answers = contributors * party_mu(release, floor, 0) / release.mu
        row.record(
            f"the plan's survivor floor is {floor}; {contributors} contributors decode {ratio:.3f} (95% CI "
            f"{ratio * (1 - half):.3f}-{ratio * (1 + half):.3f}, {samples} noise values over {ROUNDS} rounds) of the "
            f"variance the ledger charges for; an evaluation answer's noise from {contributors} contributors: "
            f"{answers:.3f} of its release; control at the former floor of {FORMER_FLOOR}: {former:.3f}",
            ratio >= ENOUGH and answers >= 1.0 - 1e-9 and former < ENOUGH,
            survivor_floor=floor,
            contributors=contributors,
            variance_ratio=round(ratio, 4),
            variance_ratio_ci=[round(ratio * (1 - half), 4), round(ratio * (1 + half), 4)],
            answer_ratio=round(answers, 4),
            former_floor_ratio=round(former, 4),
        )


# ---------------------------------------------------------------- odd plan values (item 8)


def numbers_in(node: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Where `node` (served JSON) holds a number."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from numbers_in(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from numbers_in(value, (*path, index))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path


def replaced(base: dict[str, Any], path: tuple[str | int, ...], value: object) -> bytes:
    """`base` with `value` at `path`, as the JSON an aggregator sends."""
    data = copy.deepcopy(base)
    node: Any = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(data).encode()


def field_name(path: tuple[str | int, ...]) -> str:
    """The key an error about the number at `path` must name: its own, or that of the list or table holding it."""
    sizes = FULL_PLAN["influence"]["sizes"]
    return next(str(part) for part in reversed(path) if isinstance(part, str) and part not in sizes)


def odd_values_row(book: RowBook) -> None:
    with book.row(
        f"odd plan values: each numeric field of a plan that sets them all, replaced by each of {len(ODD_VALUES)} "
        "odd values (a 400-digit integer and its negative, 2^64, -1, +-1e308, +-inf, NaN, a string, true, a list, "
        "a table), read by the collaborator's load_shared_settings",
        "every one a ConfigError naming the field: no other exception, no value taken",
        "the collaborator's plan reader in process",
    ) as row:
        plan = load_aggregator_plan(None, FULL_PLAN)
        base = shared_content(plan)
        fields = list(numbers_in(base))
        named, unnamed, taken, crashed = 0, [], [], []
        for path in fields:
            key = field_name(path)
            for value in (value for value in ODD_VALUES if is_odd(path, value)):
                try:
                    load_shared_settings(replaced(base, path, value))
                except ConfigError as error:
                    if key in str(error):
                        named += 1
                    else:
                        unnamed.append(f"{'.'.join(map(str, path))} = {short(repr(value), 30)}")
                except Exception as error:  # noqa: BLE001 -- what the row counts
                    crashed.append(f"{'.'.join(map(str, path))} = {short(repr(value), 30)}: {type(error).__name__}")
                else:
                    taken.append(f"{'.'.join(map(str, path))} = {short(repr(value), 30)}")
        total = sum(is_odd(path, value) for path in fields for value in ODD_VALUES)
        row.record(
            f"{named} of {total} odd values ({len(fields)} fields) a ConfigError naming the field; other errors: "
            f"{unnamed[:3] or 'none'}; taken: {taken[:3] or 'none'}; tracebacks: {crashed[:3] or 'none'}",
            named == total,
            fields=len(fields),
            values=total,
            named=named,
            unnamed=unnamed,
            taken=taken,
            crashed=crashed,
        )


# ---------------------------------------------------------------- served to a real collaborator (item 8)


def collaborator_run(root: Path, *, manifest: bool, edit: tuple[tuple[str | int, ...], object] | None) -> Child:
    """A real `fedfair collaborator start` against the service of :func:`serving`, run until it exits or joins."""
    name = "hospital-a"
    # Two sites, as a manifest's min_round_size needs; only this one runs, and only as far as joining.
    sections = plan_sections(secure=True, rounds=1, quorum=2, timeout=15.0)
    workspace = make_workspace(root, (name, "hospital-b"), plan=sections, manifest=manifest)
    rewrite = None if edit is None else lambda settings: replaced(json.loads(settings), *edit)
    with served(workspace, rewrite):
        child = Child(name, collaborator_command(workspace, name), env=child_environment(None), sink=io.StringIO())
        try:
            wait_until(
                lambda: child.process.poll() is not None or any("joined federation" in line for line in child.lines),
                PROCESS_SECONDS,
            )
        finally:
            child.kill()
    return child


def served_rows(root: Path, book: RowBook) -> None:
    cases = (
        ("pinned", True, (("training", "local_steps"), HUGE), "local_steps"),
        ("unpinned", False, (("influence",), {"weights": "declared", "sizes": {"hospital-a": HUGE}}), "sizes"),
    )
    control = collaborator_run(root / "control", manifest=True, edit=None)
    joined = any("joined federation" in line for line in control.lines)
    for label, manifest, edit, field in cases:
        path = ".".join(map(str, edit[0])) + ("" if field in edit[0] else f".{field}")
        holding = "holding the pinned manifest" if manifest else "without a manifest"
        with book.row(
            f"odd plan served: the aggregator serves {path} = a 400-digit integer to a real `fedfair collaborator "
            f"start` {holding}",
            f"exit status 2 with plan-mismatch naming {field}, no traceback; served the genuine plan, the same "
            "collaborator joins (the control)",
            PATCHED_AGGREGATOR,
        ) as row:
            child = collaborator_run(root / label, manifest=manifest, edit=edit)
            status = child.process.returncode
            said = next((line for line in child.lines if "plan-mismatch" in line), "")
            clean = not any("Traceback" in line for line in child.lines)
            row.record(
                f"exit status {status}, {short(said, 300) or 'no plan-mismatch line'!r}, traceback: {not clean}; "
                f"control joined: {joined}",
                status == 2 and field in said and clean and joined,
                exit_status=status,
            )
