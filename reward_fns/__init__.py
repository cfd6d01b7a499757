"""Verifiers for multi-reward RL, as one verl custom reward function.

Point verl at :func:`reward_fns.dispatch.compute_score`::

    reward.custom_reward_function.path=pkg://reward_fns.dispatch
    reward.custom_reward_function.name=compute_score

Each task family (``text_to_sql``, ``tool_calling``, ``instruction_following``) returns ``score``,
one numeric entry per reward component and one ``<component>_info`` string per component (the
verifier information that MRTPO's replay puts in the prompt). Nothing here knows about MRTPO.
"""
