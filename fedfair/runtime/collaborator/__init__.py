"""The collaborator process: one per institution; it trains on local data and submits masked sums."""
