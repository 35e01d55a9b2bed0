"""The real processes: an aggregator and one collaborator per institution, over gRPC and mutual TLS.

Runtime imports core, secagg, privacy, fairness, pki and datasets, never the research
harness; a collaborator never imports the aggregator's modules (tests/test_layers.py).
docs/layout.md lists the modules: what both sides share at this level, then ``transport/``,
``peer/`` (what every party dialling the aggregator shares), ``aggregator/``, ``collaborator/``, ``auditor/``
and ``local/``.
"""
