"""What ``fedfair reproduce`` offers (profiles, methods, Ray), named without importing the study (PyTorch).

``fedfair reproduce --help`` lists these and must start at once; :mod:`fedfair.research.reproduce`
defines each profile and method label under these names, and tests/research/test_study_options.py
holds the two equal.
"""

from __future__ import annotations

STUDY_SUMMARY = "`fedfair reproduce`: the paper's study on one dataset, as CSV tables and PNG figures."
"""The first paragraph of :mod:`fedfair.research.reproduce`'s docstring: the command's --help description."""

PROFILE_NAMES = ("figure1", "full", "quick", "table", "tuned")
"""The paper study's profiles (``--profile``), sorted."""

STUDY_METHODS = (
    "fedsrcvar",
    "fedavg",
    "fedavgm",
    "afl",
    "qfedavg",
    "propfair",
    "term",
    "deltafl",
    "bpf",
    "dro",
    "central-cvar",
    "central-erm",
    "fedminmax",
)
"""The methods the paper study runs (``--methods``), in the order of its labels."""

LONG_ROUNDS = 1000
"""The convergence table's longer run (``--long-rounds``), beside the profile's own rounds: the paper's count."""

RAY_INSTALL_HINT = (
    "pip install 'fedfair-rcvar[ray]' (in a checkout: .venv/bin/pip install -c constraints.txt -e '.[ray]')"
)
"""How to install Ray, which ``--ray`` needs and nothing else in fedfair does."""
