"""The vocabulary of component kinds.

Every part in rlzoo belongs to exactly one kind. A kind has one hook (``rlzoo_register_<plural>``),
one :class:`~rlzoo.kernel.registry.Registry` and one Protocol in :mod:`rlzoo.kernel.protocols`. This module is the
single table that ties the three together; nothing else lists kinds by hand.

Importing this module is cheap: it must not import torch, ray, vllm or megatron.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One kind of part."""

    name: str
    """Registry name used in recipes and the CLI (``advantage``, ``policy_loss`` ...)."""
    hook: str
    """Name of the hookspec that plugins implement to register parts of this kind."""
    summary: str
    """One line: what a part of this kind does."""
    config_key: str
    """Where a recipe selects a part of this kind (dotted path, ``name`` sub-key)."""


KINDS: tuple[Kind, ...] = (
    Kind(
        "advantage",
        "rlzoo_register_advantages",
        "token rewards (+ values, groups) -> advantages and returns",
        "algorithm.advantage",
    ),
    Kind(
        "policy_loss",
        "rlzoo_register_policy_losses",
        "log-probs, old log-probs, advantages, mask -> aggregated loss + metrics",
        "algorithm.policy_loss",
    ),
    Kind(
        "loss_agg",
        "rlzoo_register_loss_aggs",
        "per-token loss + mask -> scalar, invariant to micro-batch / rank splits",
        "algorithm.loss_agg",
    ),
    Kind("kl", "rlzoo_register_kls", "log-probs vs reference -> per-token KL", "algorithm.kl"),
    Kind(
        "rollout_correction",
        "rlzoo_register_rollout_corrections",
        "rollout vs trainer log-probs -> importance weights / rejection mask (off-policy)",
        "algorithm.rollout_correction",
    ),
    Kind(
        "reward_manager",
        "rlzoo_register_reward_managers",
        "decoded samples -> rewards, using scorers",
        "reward.manager",
    ),
    Kind(
        "scorer",
        "rlzoo_register_scorers",
        "(response, ground truth, data source) -> score",
        "reward.scorer",
    ),
    Kind(
        "sample_filter",
        "rlzoo_register_sample_filters",
        "keeps or drops groups of samples before training",
        "algorithm.sample_filter",
    ),
    Kind(
        "environment",
        "rlzoo_register_environments",
        "dataset row -> first observation; model turn -> next observation, reward, done (multi-turn)",
        "rollout.environment",
    ),
    Kind(
        "tool",
        "rlzoo_register_tools",
        "name + JSON-schema arguments -> text, with a timeout (called from a model's turn)",
        "rollout.tools",
    ),
    Kind(
        "agent",
        "rlzoo_register_agents",
        "a user's own agent (Python callable or command) playing one episode through the run's "
        "OpenAI-compatible gateway",
        "rollout.agent",
    ),
    Kind(
        "dataset",
        "rlzoo_register_datasets",
        "prepares a named dataset (hub name or local path) into rlzoo's parquet schema",
        "data.prepare",
    ),
    Kind(
        "train_backend",
        "rlzoo_register_train_backends",
        "owns actor / critic / reference models: log-probs, values, updates, weights, checkpoints",
        "trainer.backend",
    ),
    Kind(
        "rollout_backend",
        "rlzoo_register_rollout_backends",
        "generates responses with log-probs; streams; pauses / resumes; takes new weights",
        "rollout.backend",
    ),
    Kind(
        "runner",
        "rlzoo_register_runners",
        "the loop: when each phase runs and where",
        "runner",
    ),
    Kind(
        "logger",
        "rlzoo_register_loggers",
        "records each step's metrics and the run's config (console, jsonl, TensorBoard, W&B, MLflow)",
        "run.loggers",
    ),
)

KIND_BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}
KIND_NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
