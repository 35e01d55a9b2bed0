"""The federation's plan: the aggregator's ``plan.toml``, its sections, and the templates it is written from.

``aggregator_plan`` (parse, load with overrides, share with collaborators, fingerprint), then one
module per section it shares: ``learning_settings`` ([objective], [training], [secure_aggregation],
[quorum]), ``model``, ``influence``, ``evaluation`` and ``privacy``; ``templates`` renders the
commented plan and collaborator config that ``fedfair init`` writes.
"""
