"""The learning core: RCVaR, models, the local learner, the server step. No I/O, no network.

Both runtimes (the in-process research harness and the real processes) and every
test call these functions, so a federation of processes follows the simulation
step for step. Core imports only the standard library, numpy, torch and itself
(tests/test_layers.py enforces it).
"""
