"""An auditor without its floor: ``python lenient_auditor.py ARGS``, ``fedfair auditor start ARGS`` with the floor on the
inputs a bounded total covers removed, so it signs and tags a total of any number of sites (issue 93).

It stands for an auditor that colludes with the aggregator to read one site's input, so a test can show that each
site's own check of the verdict record still refuses such a total. Used by tests/runtime/test_bounded_processes.py.
"""

from __future__ import annotations

import sys

from fedfair.cli import main
from fedfair.secagg.bounded.context import BoundedContext

if __name__ == "__main__":
    setattr(BoundedContext, "check_floor", lambda _context, _accepted, _who: None)  # noqa: B010 -- the rewrite is the attack
    sys.exit(main(["auditor", "start", *sys.argv[1:]]))
