"""Typed capability records: what a part declares at registration and the runners ask.

One frozen dataclass per kind. A registration may pass the record itself or a plain mapping
(``capabilities={"needs_group": True}``); the registry converts the mapping, and a key the kind's
record does not declare (a misspelt capability) or a value of the wrong type is an error at
registration that names the plugin, the part and the known keys. Runners read
``component.caps.<field>`` (typed); ``component.capability("key")`` refuses an unknown key too.

Every default means "not declared": False, None or empty. Who reads each field is said in its
help. Import-light: no torch here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlzoo.kernel.binding import coerce, field_types
from rlzoo.kernel.errors import did_you_mean, raise_problems
from rlzoo.kernel.params import param

__all__ = [
    "CAPABILITIES",
    "AdvantageCapabilities",
    "Capabilities",
    "DatasetCapabilities",
    "EnvironmentCapabilities",
    "KLCapabilities",
    "LoggerCapabilities",
    "PolicyLossCapabilities",
    "RewardManagerCapabilities",
    "RolloutBackendCapabilities",
    "RolloutCorrectionCapabilities",
    "RunnerCapabilities",
    "SampleFilterCapabilities",
    "ScorerCapabilities",
    "ToolCapabilities",
    "TrainBackendCapabilities",
    "capability_record",
]


@dataclass(frozen=True)
class Capabilities:
    """Base of every kind's record (a kind without capabilities uses it as is)."""


@dataclass(frozen=True)
class AdvantageCapabilities(Capabilities):
    needs_critic: bool = param(
        False, help="needs values from a critic (the trainer builds one; validate checks the backend)"
    )
    needs_group: bool = param(
        False, help="group-relative: needs group ids and rollout.n >= 2 (validate checks)"
    )
    needs_greedy_baseline: bool = param(
        False, help="needs one extra greedy response per prompt (the runners generate it)"
    )
    needs_old_log_probs: bool = param(
        False,
        help="reads inputs.old_log_probs (the log-probs of the sampling policy; the conformance suite passes them)",
    )
    needs_sum_pi_squared: bool = param(
        False,
        help="reads inputs.sum_pi_squared [B, T] (sum over the vocabulary of pi^2 of the old policy): the "
        "trainer asks the train backend for it in the old-log-prob forward; validate refuses a backend "
        "without supplies_sum_pi_squared",
    )
    needs_teacher: bool = param(
        False,
        help="reads inputs.teacher_log_probs [B, T] (a teacher's log-probs of the sampled tokens): the trainer "
        "asks the train backend for them; validate refuses it without algorithm.teacher, or on a train backend "
        "without supports_teacher",
    )
    needs_reward_components: bool = param(
        False,
        help="reads inputs.reward_components [B, K]: the scorers' per-sample info values named by its "
        "params' reward_keys (rlzoo.kernel.protocols.RewardComponentKeys); a missing key fails the first step",
    )


@dataclass(frozen=True)
class PolicyLossCapabilities(Capabilities):
    needs_old_log_probs: bool = param(
        False, help="reads inputs.old_log_probs (the ratio; gpg declares False)"
    )
    needs_entropy: bool = param(False, help="reads inputs.entropy (the conformance suite passes it)")
    needs_teacher_distribution: bool = param(
        False,
        help="reads inputs.teacher_divergence [B, T]: its own divergence (rlzoo.kernel.protocols."
        "TeacherDivergenceLoss) between the student's and the teacher's whole next-token distributions, which the "
        "train backend computes in the update's forward; validate refuses it without algorithm.teacher or on a "
        "train backend without supplies_teacher_divergence",
    )
    reads_advantages: bool = param(
        True,
        help="reads inputs.advantages; False (nll): the trainer skips the advantage estimator and "
        "validate its group rule",
    )
    sequence_level: bool = param(
        False, help="ratios / weights per whole sequence (shown by rlzoo components)"
    )
    fixed_aggregation: str | None = param(
        None, help="the loss_agg its paper uses; validate prints a note when algorithm.loss_agg differs"
    )
    batch_statistics: bool = param(
        False,
        help="uses statistics of the whole mini-batch (e.g. covariance clipping): results depend on "
        "the micro-batch split (shown by rlzoo components)",
    )


@dataclass(frozen=True)
class KLCapabilities(Capabilities):
    needs_reference: bool = param(False, help="needs a frozen reference policy's log-probs")


@dataclass(frozen=True)
class RolloutCorrectionCapabilities(Capabilities):
    needs_old_log_probs: bool = param(False, help="compares the trainer's old log-probs with the rollout's")
    sequence_level: bool = param(
        False, help="weights / rejection per whole sequence (shown by rlzoo components)"
    )


@dataclass(frozen=True)
class RewardManagerCapabilities(Capabilities):
    batched: bool = param(False, help="scores a whole batch in one scorer call")


@dataclass(frozen=True)
class ScorerCapabilities(Capabilities):
    batched: bool = param(
        False,
        help="called with lists (responses, ground truths, ...) and returns a list (reward managers ask)",
    )
    requires: str | None = param(
        None, help="the optional distribution it needs; validate checks it is installed"
    )
    extra: str | None = param(None, help="the pip extra that installs `requires`")


@dataclass(frozen=True)
class SampleFilterCapabilities(Capabilities):
    needs_group: bool = param(False, help="judges whole groups (several responses per prompt)")
    refills: bool = param(False, help="dropped groups are regenerated by the runner until the batch is full")


@dataclass(frozen=True)
class EnvironmentCapabilities(Capabilities):
    offers_tools: bool = param(
        False,
        help="env.tools() may return tools the model calls (without it, tools() must be empty; the conformance suite checks)",
    )
    per_turn_rewards: bool = param(
        False, help="step() returns a reward on intermediate turns, not only the last (shown)"
    )
    is_async: bool = param(False, help="reset / step are coroutines (shown; the rollout awaits either kind)")
    requires: str | None = param(
        None, help="the optional distribution it needs; validate checks it is installed"
    )
    extra: str | None = param(None, help="the pip extra that installs `requires`")


@dataclass(frozen=True)
class ToolCapabilities(Capabilities):
    is_async: bool = param(False, help="call() is a coroutine (shown; the rollout awaits either kind)")
    requires: str | None = param(
        None, help="the optional distribution it needs; validate checks it is installed"
    )
    extra: str | None = param(None, help="the pip extra that installs `requires`")


@dataclass(frozen=True)
class DatasetCapabilities(Capabilities):
    modalities: tuple[str, ...] = param((), help="what the prompts hold: 'text', 'image'")
    requires: str | None = param(
        None, help="the optional distribution it needs; validate checks it is installed"
    )
    extra: str | None = param(None, help="the pip extra that installs `requires`")


@dataclass(frozen=True)
class TrainBackendCapabilities(Capabilities):
    devices: tuple[str, ...] = param((), help="devices it trains on (shown by rlzoo components)")
    distributed: bool = param(False, help="spans processes (a torch.distributed group)")
    supports_critic: bool = param(
        False, help="can train a critic; validate refuses a needs_critic advantage without it"
    )
    supplies_sum_pi_squared: bool = param(
        False,
        help="implements rlzoo.kernel.protocols.SumPiSquaredSource (log-probs + sum_pi_squared in one forward); "
        "validate refuses a needs_sum_pi_squared advantage without it",
    )
    supports_lora: bool = param(
        False, help="trains LoRA adapters (trainer.lora); validate refuses trainer.lora without it"
    )
    supports_teacher: bool = param(
        False,
        help="loads a forward-only teacher (algorithm.teacher) and serves compute_log_probs(model='teacher'); "
        "validate refuses a teacher without it",
    )
    supplies_teacher_divergence: bool = param(
        False,
        help="computes the objective's teacher_divergence over the whole vocabulary in the update's forward, "
        "chunk by chunk (a needs_teacher_distribution policy loss, e.g. gkd); validate refuses one without it",
    )
    requires: str | None = param(None, help="the optional distribution it needs (pip install rlzoo[EXTRA])")
    extra: str | None = param(None, help="the pip extra that installs `requires`")


@dataclass(frozen=True)
class RolloutBackendCapabilities(Capabilities):
    supports_partial_rollout: bool = param(
        False, help="pauses requests at a weight sync and resumes them (fully_async checks)"
    )
    supports_streaming: bool = param(False, help="yields samples as they finish (fully_async checks)")
    supports_lora: bool = param(
        False,
        help="applies LoRA adapter pushes (RolloutSpec.lora); validate refuses trainer.lora without it",
    )
    records_routes: bool = param(
        False,
        help="can record a MoE model's experts per token (params record_routes; Sample.routed_experts): "
        "what a trainer's router replay needs",
    )
    supplies_prompt_log_probs: bool = param(
        False,
        help="scores given token ids with the log-prob of each token given its prefix "
        "(rlzoo.kernel.protocols.PromptLogProbSource): a second engine of it, loaded from the teacher, can be "
        "the teacher (algorithm.teacher.backend: rollout); validate refuses that teacher without it",
    )
    devices: tuple[str, ...] = param((), help="devices it generates on (shown by rlzoo components)")
    distributed: bool = param(False, help="spans processes")
    requires: str | None = param(None, help="the optional distribution it needs")
    extra: str | None = param(None, help="the pip extra that installs `requires`")


@dataclass(frozen=True)
class RunnerCapabilities(Capabilities):
    placements: tuple[str, ...] = param((), help="placements it runs on; validate checks placement.name")


@dataclass(frozen=True)
class LoggerCapabilities(Capabilities):
    requires: str | None = param(
        None, help="the optional distribution it needs; validate checks it is installed"
    )
    extra: str | None = param(None, help="the pip extra that installs `requires`")


#: The capability record of each kind (a kind missing here declares none).
CAPABILITIES: Mapping[str, type[Capabilities]] = {
    "advantage": AdvantageCapabilities,
    "policy_loss": PolicyLossCapabilities,
    "loss_agg": Capabilities,
    "kl": KLCapabilities,
    "rollout_correction": RolloutCorrectionCapabilities,
    "reward_manager": RewardManagerCapabilities,
    "scorer": ScorerCapabilities,
    "sample_filter": SampleFilterCapabilities,
    "environment": EnvironmentCapabilities,
    "tool": ToolCapabilities,
    "dataset": DatasetCapabilities,
    "train_backend": TrainBackendCapabilities,
    "rollout_backend": RolloutBackendCapabilities,
    "runner": RunnerCapabilities,
    "logger": LoggerCapabilities,
}


def capability_record(
    kind: str, declared: Mapping[str, Any] | Capabilities | None, where: str
) -> Capabilities:
    """``declared`` as the kind's record; ValueError naming ``where`` for an unknown key or a bad value."""
    cls = CAPABILITIES.get(kind, Capabilities)
    if isinstance(declared, Capabilities):
        if not isinstance(declared, cls):
            raise ValueError(f"{where}: capabilities must be a {cls.__name__}, got {type(declared).__name__}")
        return declared
    fields = {f.name for f in dataclasses.fields(cls)}
    hints = field_types(cls)
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, value in (declared or {}).items():
        if key not in fields:
            hint = did_you_mean(str(key), fields)
            known = ", ".join(sorted(fields)) or "(none: this kind declares no capabilities)"
            problems.append(f"unknown capability {key!r}{hint} Known capabilities of a {kind}: {known}")
            continue
        values[key] = coerce(value, hints[key], f"capability {key!r}", problems)
    raise_problems(where, problems)
    return cls(**values)
