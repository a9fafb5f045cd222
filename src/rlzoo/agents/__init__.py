"""Multi-turn, tool-calling rollouts: trajectories of token ids.

A trajectory is the prompt's ids, then per turn the ids the engine sampled (trained, loss mask 1)
and the ids of the environment's or a tool's reply, rendered as the chat template's delta (loss
mask 0). Sampled ids are never decoded and encoded again. See ``docs/agents.md``.
"""
