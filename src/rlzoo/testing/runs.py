"""Overrides for tests that run a whole recipe to check parts other than the backends (loggers,
runners, data): the run is real, the model work is simulated."""

from __future__ import annotations

#: the built-in ``simulated`` rollout and train backends (``src/rlzoo/backends/simulated``): ~1 ms decode
#: steps, long-tailed response lengths up to 32 tokens, near-free training
SIMULATED_BACKENDS: tuple[str, ...] = (
    "~rollout.backend",
    "+rollout.backend={name:simulated,decode_step_s:0.001,mean_response_length:6,sigma:1.0}",
    "~trainer.backend",
    "+trainer.backend={name:simulated,update_s_per_token:2e-6,forward_s_per_token:2e-7}",
    "data.max_response_length=32",
)
