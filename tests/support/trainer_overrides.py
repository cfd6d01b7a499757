"""Config overrides shared by the tests that build verl's v1 trainers in process."""

from __future__ import annotations

#: separate_async's own rules (verl asserts them in ``__init__``): 2 prompts = 2 mini-steps x 1 prompt.
SEPARATE_ASYNC_RULES = (
    "data.train_batch_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    "trainer.v1.separate_async.parameter_sync_step=2",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
)
