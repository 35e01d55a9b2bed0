"""How large a plan's numbers may be: each is range-checked, from above as from below, before any use.

A collaborator reads the plan the aggregator serves as JSON, where an integer may have 4,000 digits and a
float may be 1e308; a value its reader took would first be used in arithmetic (2 lr local_steps, a declared
batch, a timer, a model's size) and end in an OverflowError or an allocation the machine cannot make, not in
a named error. So every number of a plan has a ceiling here, and each reader refuses a value above it with
the rest of its range (:class:`fedfair.core.config.Interval`, or :meth:`fedfair.core.tables.Table.integer`'s
``high``). The ceilings are far above any real federation's values, and name what they protect.
"""

from __future__ import annotations

import dataclasses

from fedfair.core.config import Interval
from fedfair.core.tables import REQUIRED, Required, Table
from fedfair.datasets.statistics import MAX_SITE_ROWS
from fedfair.privacy.distributed import MAX_PARTIES

PLAN_NUMBER_MAX = 1e9
"""The largest value of a plan number bounded by nothing else (a step size, a clip or norm bound, the cap B,
gamma, a weight, an epsilon, seconds, a factor): finite arithmetic on it stays far from float overflow, and
a timer of that many seconds is within what threads accept."""

MAX_COLLABORATORS = MAX_PARTIES
"""The most collaborators a plan may have: what the training noise's delta is counted for."""

MAX_ROUNDS = 10**6
"""The most training rounds (and the largest evaluation period): a million round trips is years of rounds."""

MAX_LOCAL_STEPS = 10**5
"""The most local SGD steps a round: each is a mini-batch pass at every site."""

MAX_FEATURES = 2**24
"""The largest model input: a 4096 x 4096 image."""

MAX_CLASSES = 2**16
"""The most classes a model may predict."""

MAX_PARAMETERS = 2**28
"""The most weights a built-in model's first layer may hold (features x classes): 1 GiB of float32."""

MAX_SEED = 2**32 - 1
"""The largest training seed: every generator fedfair seeds takes it, times a site's offset."""

MAX_ROWS = MAX_SITE_ROWS
"""The most rows a site may declare, or a bucket need: the most one site may contribute to a sum."""


def capped(interval: Interval) -> Interval:
    """`interval` with its upper end at :data:`PLAN_NUMBER_MAX` at most: what a plan may hold of it."""
    return dataclasses.replace(interval, high=min(interval.high, PLAN_NUMBER_MAX))


def positive(meaning: str) -> Interval:
    """A number above 0 and at most :data:`PLAN_NUMBER_MAX`; `meaning` says what it is, in errors."""
    return Interval(0.0, PLAN_NUMBER_MAX, low_open=True, meaning=meaning)


def number_in(t: Table, key: str, interval: Interval, default: float | Required = REQUIRED) -> float:
    """`key` of table `t`, refused (naming the range) unless a finite number in `interval`; `default` if absent."""
    return t.number(key, default, check=interval.__contains__, expected=interval.expected)
