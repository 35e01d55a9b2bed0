"""The false-alarm rate of each statistical assertion on noise the suite cannot seed, and its normal threshold.

Such noise comes from the OS's CSPRNG: a Skellam key from os.urandom, the DP-SGD generator's seed from
`secrets`, a federation's noise shares. An assertion on it fails a correct tree with some probability, and CI
must pass first time. The suite makes about 36 such assertions a run (tests/secagg/test_noise.py 13,
test_encode_noise.py 6, bounded/test_views.py 6, tests/privacy/test_learner.py 4 and the rest two or three a
file); at FALSE_ALARM each, a union bound puts a correct tree's failure below 4e-7 a suite run. At the previous
1e-6 an assertion, the same count failed once in about 28,000 runs.

A test on seeded noise is deterministic and needs none of this; one whose bound is a stated probability (a
report's 95% interval) counts its misses against a binomial quantile at FALSE_ALARM instead.
"""

from __future__ import annotations

from scipy import stats

FALSE_ALARM = 1e-8
"""The most an assertion on unseeded noise may fail a correct tree, per run."""

Z = float(stats.norm.isf(FALSE_ALARM / 2))
"""The two-sided normal threshold at FALSE_ALARM: 5.73 standard deviations."""
