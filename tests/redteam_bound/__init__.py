"""Red-team checks of the two-verifier input bound's catch-up (issue 98) and kept settlement (issue 94): each a break, failing."""
