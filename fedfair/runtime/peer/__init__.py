"""What every party that dials the aggregator shares: the connection, its back-off, its watchdog, its uplink.

A collaborator and the auditor are both peers of the aggregator: ``connection`` dials it over mutual TLS and
follows its task stream, ``retries`` classifies a failed call and backs off, ``watchdog`` ends a wait on a silent
aggregator, ``uplink`` downloads a stage's input and sends an upload in bounded chunks. Nothing here imports a
role's package (tests/test_layers.py): what a task computes is the party's own.
"""
