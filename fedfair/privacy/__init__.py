"""Differential privacy for a collaborator: DP-SGD on its local steps, accounting, budgets.

Each institution decides its own privacy. With it on, every local step is DP-SGD
(Abadi et al. 2016) through Opacus: a Poisson sample of the local data, one
gradient per sample, each clipped to norm C, summed, Gaussian noise of standard
deviation sigma * C added, divided by the expected batch size b. The threshold c
is trained by the same steps, so its per-sample gradient is clipped together with
theta's (one joint norm) and noised alike; that is why c lives in a module
(`RCVaRThreshold`) with a registered per-sample gradient rather than beside it.

Why: docs/design.md, "Inside the privacy library".
"""
