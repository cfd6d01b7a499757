"""verl glue for the training step: the replay stage and the v1 trainer that runs it."""
