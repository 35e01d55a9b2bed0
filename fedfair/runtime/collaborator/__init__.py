"""The collaborator process: one per institution; it trains on local data and submits masked sums.

``config`` reads its own file, ``client`` follows the aggregator's tasks, ``steps`` runs the
secure-aggregation steps of a round, ``retries`` backs off from a lost aggregator, ``trainer``
builds its learner, ``commands`` is ``fedfair collaborator start``.
"""
