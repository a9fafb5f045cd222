"""Compatibility index of the runner pieces, which now live by concern:

- :mod:`rlzoo.runners.inputs`: data preparation, input checks, tokenizer / processor, specs, datasets;
- :mod:`rlzoo.runners.rewards`: scorer dispatch, scoring, the sample filter's view, validation scores;
- :mod:`rlzoo.runners.batching`: sampling params, requests, collation, rollout metrics;
- :mod:`rlzoo.runners.policy`: the policy update (:class:`PolicyTrainer`);
- :mod:`rlzoo.runners.checkpoint`: checkpoints, the run-directory lock, metrics on resume, the summary;
- :mod:`rlzoo.runners.loop`: the one training loop.

New code imports from those modules; this one keeps older imports working.
"""

from __future__ import annotations

from rlzoo.runners.batching import (
    clip_ratio,
    make_requests,
    rollout_metrics,
    samples_to_batch,
    sampling_params,
)
from rlzoo.runners.checkpoint import CheckpointManager, write_summary
from rlzoo.runners.inputs import (
    build_datasets,
    check_inputs,
    ensure_data,
    eos_ids,
    expand,
    load_processor,
    load_tokenizer,
    resolve_device,
    rollout_spec,
    train_spec,
)
from rlzoo.runners.policy import PolicyTrainer
from rlzoo.runners.rewards import (
    ScorerDispatch,
    build_reward_manager,
    filter_value,
    score_samples,
    validation_metrics,
)

__all__ = [
    "CheckpointManager",
    "PolicyTrainer",
    "ScorerDispatch",
    "build_datasets",
    "build_reward_manager",
    "check_inputs",
    "clip_ratio",
    "ensure_data",
    "eos_ids",
    "expand",
    "filter_value",
    "load_processor",
    "load_tokenizer",
    "make_requests",
    "resolve_device",
    "rollout_metrics",
    "rollout_spec",
    "samples_to_batch",
    "sampling_params",
    "score_samples",
    "train_spec",
    "validation_metrics",
    "write_summary",
]
