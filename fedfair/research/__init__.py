"""The research harness: in-process simulation, baselines, centralized references, experiments, launch's baseline."""
