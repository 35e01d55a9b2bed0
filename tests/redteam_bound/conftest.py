"""The red team's tests fail until their break is fixed, so no suite collects them unless asked.

Run them with ``FEDFAIR_REDTEAM=1 .venv/bin/python -m pytest -n 0 -p no:randomly tests/redteam_bound``.
"""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("FEDFAIR_REDTEAM") else ["test_*.py"]

__all__ = ["collect_ignore_glob"]
