"""The auditor's process: the second verifier of a plan's two-verifier input bound (``fedfair auditor start``).

Why: docs/security.md, "Bounded inputs (two verifiers)".
"""
