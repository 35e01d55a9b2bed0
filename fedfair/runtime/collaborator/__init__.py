"""The collaborator process: one per institution; it trains on local data and submits masked sums.

``config`` reads its own file, ``client`` is the collaborator (its parts: ``connection`` dials the
aggregator and follows its task stream, ``stream`` carries out each task, ``identity`` checks its TLS
files, ``preparation`` the plan and its data, ``rounds`` trains, bounds and encodes, ``uplink`` sends
and counts, ``receipt`` keeps the model bundle), ``steps`` runs the secure-aggregation steps of a
round, ``retries`` backs off from a lost aggregator, ``trainer`` builds its learner, ``commands`` is
``fedfair collaborator start``.
"""
