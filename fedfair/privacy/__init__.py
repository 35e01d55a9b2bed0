"""Differential privacy for a collaborator: DP-SGD on its local steps, accounting, budgets.

Each institution decides its own privacy. With it on, every local step is DP-SGD
(Abadi et al. 2016) through Opacus: a Poisson sample of the local data, one
gradient per sample, each clipped to norm C, summed, Gaussian noise of standard
deviation sigma * C added, divided by the expected batch size b. The threshold c
is trained by the same steps, so its per-sample gradient is clipped together with
theta's (one joint norm) and noised alike; that is why c lives in a module
(`RCVaRThreshold`) with a registered per-sample gradient rather than beside it.

The guarantee an institution can trust is the one over the whole federation, not
one round: every round's steps join one history (noise, sample rate, steps) per
collaborator, persisted in a JSON state file so that it survives restarts, and
the cumulative (epsilon, delta) comes from a PRV accountant (RDP as a cross-check).
A round that would push epsilon past the collaborator's budget is refused before
it trains (`PrivacyBudgetError`); the federation goes on without it while
its quorum holds. Poisson samples and noise come from OS entropy, never from the
plan's seed, which the aggregator knows.

Choosing the clip bound: samples above c carry large theta gradients, so a bound
far below typical per-sample gradient norms shrinks their pull on c more than the
others' and c settles below the (1 - rho)-quantile, drifting the model toward ERM.
A bound near the typical norm keeps c where it belongs (benchmarks/dp_bench.py
shows both on Adult).

The modules: `config` (`PrivacyConfig`, what `[privacy]` and the `--dp-*` flags
build; free of torch), `hooks` (Opacus: the threshold's per-sample gradient and
norm, which models qualify), `clipping` (how each step clips, chosen automatically:
one pass for models of dense layers, which builds the clipped gradient from each
layer's inputs and per-sample output gradients; two passes with norm-only hooks for
Conv, LayerNorm and Embedding; per-sample gradients for any other layer),
`accounting` (`compute_epsilon`, `plan_noise_multiplier`,
`PrivacyAccountant`, the persisted history), `learner` (`PrivateLearner`, which wraps
a core `LocalLearner`) and `commands` (the flags and `fedfair privacy`). This file
imports none of them, so importing `fedfair.privacy.config` does not load Opacus.
"""
