"""Reusable worker processes that run a family's checks under a wall-clock deadline.

* `pool`: the pool (start, deadline enforced by killing, replacement, bounded start retries);
* `worker`: a worker process's entry point (resource limits, then one task module's ``TASKS``);
* `protocol`: the framed, plain-data-only wire format between them.
"""
