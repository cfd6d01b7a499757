"""Pure tensor math of MRTPO (imports torch and numpy only; no ray, no verl).

- :mod:`.relevance`: Jensen–Shannon distance between next-token distributions.
- :mod:`.token_weights`: relevance → per-token weights, warm-up schedule, shuffle ablation.
- :mod:`.token_advantage`: per-reward advantages × weights → token advantages.
- :mod:`.reward_reweighting`: optional response-level reward weights (SAW-style).
"""
