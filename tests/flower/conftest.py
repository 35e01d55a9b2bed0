"""The Flower tests' environment: no update check, no usage report, Flower's home in a folder of the test's own."""

from __future__ import annotations

import os

# Flower checks for a newer release and Ray reports usage unless told not to; neither may reach for the network.
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
