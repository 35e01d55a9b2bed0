"""Group risk at protected group size rho, one report type: from per-sample values in one place or from secure sums."""
