"""The real processes: an aggregator and one collaborator per institution, over gRPC and mutual TLS.

Shared by both sides: ``contract`` (stages, round parameters), ``plan/`` (the aggregator's
plan, one module per section it shares, its digest), ``toml_tables`` (checked reading of TOML
tables), ``manifest``, ``composition_counts``, ``transport/``, ``logs`` and ``faults``. Then
``aggregator/`` and ``collaborator/``; ``report/`` draws a finished run.

Runtime imports core, secagg, privacy, fairness, pki and datasets, never the research
harness; a collaborator never imports the aggregator's modules (tests/test_layers.py).
"""
