"""The real processes: an aggregator and one collaborator per institution, over gRPC and mutual TLS.

Shared by both sides: ``contract`` (stages, round parameters), ``plan`` (the aggregator's
plan, what it shares, its digest), ``settings`` (the plan's learning sections and their
conversions to the core's configs; TOML is read by ``fedfair.core.tables``),
``transport/``, ``logs`` and ``faults``. Then ``aggregator/`` and ``collaborator/``.

Runtime imports core, secagg, privacy, fairness, pki and datasets, never the research
harness; a collaborator never imports the aggregator's modules (tests/test_layers.py).
"""
