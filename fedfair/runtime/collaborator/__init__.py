"""The collaborator process: one per institution; it trains on local data and submits masked sums.

``config`` reads its own file, ``client`` is the collaborator (its parts: ``stream`` carries out each task the
shared :mod:`fedfair.runtime.peer` connection hands over, ``identity`` checks its TLS files, ``preparation`` the
plan and its data, ``rounds`` trains, bounds and encodes, ``receipt`` keeps the model bundle), ``steps`` runs the
secure-aggregation steps of a round, ``trainer`` builds its learner
(``fedfair collaborator start`` is :mod:`fedfair.cli.collaborator`).
"""
