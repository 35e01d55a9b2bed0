"""What an operator sees of a running federation: its events, its state, its metrics, its page and its logs.

``events`` (the aggregator's event stream and its schema), ``status`` (a federation's state now, read from its
output folder), ``status_page`` and ``federation_metrics`` (the aggregator's page and Prometheus families,
drawn from that state), ``endpoint`` (a party's HTTP monitoring endpoint), ``logs`` and ``progress`` (what the
processes and commands print). A collaborator's own privacy metrics are in ``fedfair.runtime.collaborator``.
"""
