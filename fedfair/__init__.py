"""fedfair: federated learning that protects every large enough subgroup.

Minimises RCVaR (a blend of the mean loss and the mean loss of the worst
rho-fraction of all samples) with FedSRCVaR, exchanging only the model and one
scalar threshold, under secure aggregation.
"""

__version__ = "0.1.0"
