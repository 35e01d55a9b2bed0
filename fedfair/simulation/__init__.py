"""The in-process engine: a whole federation in one process, running the algorithm the real processes run.

- `fedfair.simulation.federation`: the collaborators' data (`Federation`);
- `fedfair.simulation.rounds`: Algorithm 1's rounds (`SimulationOptions`, `run_rounds`, `run_fedsrcvar`);
- `fedfair.simulation.vectorised`: every collaborator's local steps as one batched computation;
- `fedfair.simulation.secure`: secure aggregation of each round in process (`SecureSum`).

`fedfair.api.federate` is the one-call front door; the research harness (`fedfair.research`)
builds its baselines and studies on these modules.
"""
