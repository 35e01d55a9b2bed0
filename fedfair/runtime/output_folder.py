"""The aggregator's output folder: the name of every file the aggregator, the report and `launch` write there.

One place for the layout, so that the readers (``fedfair status``, ``fedfair report``, ``fedfair logs``, the
metrics endpoint) name a file without importing its writer (the checkpoint's writer imports PyTorch). The folder
is the plan's ``[aggregator] output``; docs/operations.md describes what each file holds.
"""

from __future__ import annotations

CHECKPOINT_NAME = "checkpoint.pt"
"""The model and server state after the last applied round (``fedfair.runtime.aggregator.checkpoint``)."""

ROUND_LOG_NAME = "rounds.jsonl"
"""One JSON record per finished round, applied or aborted, appended as each round ends."""

EVENTS_NAME = "events.jsonl"
"""The operator's event stream (:data:`fedfair.runtime.observe.events.EVENTS` is its schema)."""

FINAL_MODEL_NAME = "final_model.pt"
"""The final model's tensors, written once the last round is done."""

FINAL_SUMMARY_NAME = "final_model.json"
"""The final model's summary: its rounds, its settings and its final evaluation."""

BUNDLE_NAME = "model_bundle.pt"
"""The model bundle a site can load and serve (``fedfair.runtime.aggregator.bundles``)."""

PAST_ROUNDS_NAME = "past-rounds"
"""The public inputs of the last applied training rounds, one folder each, for a site that missed one
(``fedfair.runtime.aggregator.past_rounds``)."""

LOCK_NAME = "aggregator.lock"
"""The lock that keeps a second aggregator off the folder (it holds the owner's PID)."""

REPORT_NAME = "report.html"
"""The run report (``fedfair.runtime.report``)."""

COMPARISON_NAME = "comparison.json"
"""What ``launch`` compared the federation with (FedSRCVaR against FedAvg on the same rows)."""

COMPARISON_COLUMNS = (
    ("worst_risk", "worst-group risk"),
    ("mean_risk", "mean risk"),
    ("disparity", "disparity"),
    ("accuracy", "accuracy"),
    ("worst_error", "worst-group error"),
)
"""The comparison's exact table, in the console and the report alike: each exact report's key and its heading."""
