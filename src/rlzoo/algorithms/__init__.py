"""Algorithm parts: advantages, policy losses, loss aggregation, KL, rollout corrections, sample
filters, reward managers and generic scorers. Tasks (datasets, environments, tools, a task's own
scorer) live in :mod:`rlzoo.tasks`."""
