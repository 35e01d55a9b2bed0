"""The attack suite behind ``benchmarks/attack_matrix.py``: hostile clients against a live federation.

Two kinds of module, kept apart on purpose:

- the hostile side, written from the wire schema alone (``hostile_client``, ``secagg_wire``,
  ``fuzz``, ``fuzz_mutations``, ``rows``): they import only the generated protobuf/gRPC modules, ``grpc``,
  ``cryptography``, ``numpy`` and the standard library, never fedfair's collaborator or
  transport helpers, so every refusal they meet is the aggregator holding against code
  that is not ours (``tests/test_attack_matrix.py`` checks their imports);
- the orchestration (``federation``, ``cheating``, ``scenarios``), which builds the real
  federation with fedfair itself (certificates, plans, the aggregator process, honest
  collaborators, the patched aggregator and collaborators that play insiders) and checks
  the outcome against fedfair's own round log and checkpoints.
"""
