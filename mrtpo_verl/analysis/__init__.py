"""Offline analyses of the replay's relevance (e.g. the paper's Table 4 localisation ratio)."""
