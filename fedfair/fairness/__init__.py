"""Group risk at a protected group size rho: from per-sample values in one place, or from secure sums."""
