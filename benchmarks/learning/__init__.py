"""Does it learn better? MRTPO vs GDPO vs MRTPO with shuffled relevance on verl's real trainer.

``python -m benchmarks.learning --preset cpu|gpu|smoke`` (or ``recipes/learning/compare.sh``) trains
every arm (:mod:`~benchmarks.learning.arms`) with the same data order, seeds, rollout settings and
learning rate, several seeds each, in one round-robin plan (:mod:`~benchmarks.learning.cli`); a
held-out set is evaluated greedily every few steps with the same reward functions; each run's
per-step records (every reward's training and evaluation mean, KL, entropy, step time) come from
verl's file-logger metrics (:mod:`~benchmarks.learning.records`); the report has a plot per reward
with 95% bands over seeds, final evaluation and steps-to-threshold with intervals, and the step-time
ratio (:mod:`~benchmarks.learning.report`). Finished runs are kept; an interrupted one resumes from
verl's checkpoint (:mod:`~benchmarks.learning.runner`).
"""
