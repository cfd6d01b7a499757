"""Benchmarks of mrtpo_verl (run from the repository root, e.g. ``python -m benchmarks.js_relevance``)."""
