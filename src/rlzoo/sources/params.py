"""Params of the runners (import-light: no torch).

The runners are registered from :mod:`rlzoo.sources`; their batch sources live in
:mod:`rlzoo.sources.sync`, :mod:`rlzoo.sources.one_step_off` and :mod:`rlzoo.sources.fully_async`
and are imported only when a run uses them. ``check(cfg)`` (:class:`rlzoo.kernel.protocols.ChecksRecipe`)
is called by :func:`rlzoo.recipe.checks.check_consistency`, so ``rlzoo validate`` reports every problem
with the knobs before any model loads; ``step_plan(cfg)`` (:class:`rlzoo.kernel.protocols.PlansSteps`)
cuts a fully-async run into trainer steps.

Units (the same as verl's fully-async trainer, whose knob names we keep):

- a **group** is one prompt with its ``rollout.n`` responses; verl calls it a "sample" in the
  queue and in ``total_rollout_steps``. The queue and every budget below count groups.
- a **trainer step** takes ``require_batches`` mini-batches of ``trainer.ppo_mini_batch_size``
  groups (``data.train_batch_size`` when unset), i.e. ``R * M`` groups, ``R * M * n`` responses.
- a **policy version** (``param_version``) is the number of weight pushes from the trainer to the
  rollout backend; it advances every ``trigger_parameter_sync_step`` trainer steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlzoo.data.schema import RESPONSE_COLUMN, rows_without_response
from rlzoo.kernel.params import param
from rlzoo.kernel.settings import StepPlan


def mini_batch_groups(cfg: Any) -> int:
    """M: groups (prompts) per PPO mini-batch."""
    mb = cfg.trainer.ppo_mini_batch_size
    return int(mb if mb is not None else cfg.data.train_batch_size)


def window_budget(staleness_threshold: float, trigger_parameter_sync_step: int, step_groups: int) -> int:
    """Groups the Rollouter may start per sync window: ``floor((1 + s) * K * R * M)``.

    Counts the groups started since the last weight push plus the groups carried over from older
    weights (queued or in flight at the push).
    """
    return math.floor((1.0 + staleness_threshold) * trigger_parameter_sync_step * step_groups + 1e-9)


def max_staleness_versions(staleness_threshold: float) -> int:
    """The bound in policy versions: ``ceil(staleness_threshold)`` (0 for on-policy)."""
    return max(0, math.ceil(staleness_threshold - 1e-9))


def _dataset_rows(files: list[str]) -> int | None:
    """Rows of the training parquet files, from their footers only; None when unknown."""
    total = 0
    for f in files:
        p = Path(f).expanduser()
        if not p.exists():
            return None
        try:
            import pyarrow.parquet as pq

            total += pq.ParquetFile(str(p)).metadata.num_rows
        except Exception:
            return None
    return total if files else None


def _common_checks(cfg: Any, runner: str) -> list[str]:
    problems: list[str] = []
    adv = cfg.algorithm.advantage
    if adv is not None and adv.capability("needs_greedy_baseline"):
        problems.append(
            f"algorithm.advantage: {adv.name!r} needs a greedy baseline response per prompt, which the "
            f"{runner} runner does not generate; use runner=sync"
        )
    if cfg.placement.name == "ray" and cfg.placement.colocate:
        problems.append(
            f"placement.colocate: the {runner} runner generates while it trains, so rollout and training need "
            "their own pools: set placement.colocate=false with placement.trainer / placement.rollout pools"
        )
    return problems


@dataclass(frozen=True)
class SyncParams:
    """Synchronous on-policy loop: generate a whole batch, score it, train on it, sync weights.

    The slowest response of a batch gates the step (see ``fully_async`` for overlap). Validation
    runs before training (``trainer.val_before_train``) and every ``trainer.test_freq`` steps;
    checkpoints every ``trainer.save_freq`` steps.

    ``on_policy_fraction`` is TRL's GKD ``lmbda``: each step draws ``u`` uniform in [0, 1) and
    generates the batch (the policy's own samples) when ``u <= lmbda``; otherwise the step's prompts
    are trained with the training rows' own ``response`` column (one assistant turn, rendered with
    the chat template as the sft runner renders a demonstration, each repeated ``rollout.n`` times so
    the mini-batches keep their shape), scored as samples are. 1 (the default) draws nothing: every
    batch is generated, as before the setting existed. 0: only the dataset's responses.
    """

    on_policy_fraction: float = param(
        1.0,
        ge=0.0,
        le=1.0,
        help="lambda of TRL's GKD: the probability that a step trains on the policy's own samples; otherwise "
        "on the training rows' 'response' column (every row must have one)",
    )

    def check(self, cfg: Any) -> list[str]:
        if self.on_policy_fraction >= 1.0:
            return []
        problems: list[str] = []
        if cfg.rollout.environment is not None:
            problems.append(
                f"runner.on_policy_fraction: {self.on_policy_fraction} takes a dataset response as one assistant "
                "turn, which a multi-turn environment's trajectory is not; set it to 1 with rollout.environment"
            )
        bad = rows_without_response(cfg.data.train_files)
        if bad:
            problems.append(
                f"runner.on_policy_fraction: {self.on_policy_fraction} trains a {1 - self.on_policy_fraction:g} "
                f"share of the steps on the training rows' {RESPONSE_COLUMN!r} column, but {bad}; give every "
                f"training row a non-empty {RESPONSE_COLUMN!r} (the assistant's reply), or set "
                "runner.on_policy_fraction=1"
            )
        return problems


@dataclass(frozen=True)
class FullyAsyncParams:
    """Fully asynchronous loop: a Rollouter streams groups into a staleness-aware queue; a Trainer pulls them.

    The Rollouter (a thread) submits prompts x ``rollout.n`` to the rollout backend, consumes its
    stream one sample at a time, hands them to a scoring stage (``scoring_workers`` threads; the
    Rollouter keeps generating while a scorer runs) and puts each complete, scored group into the
    queue. The Trainer takes ``require_batches`` mini-batches per step and pushes weights every
    ``trigger_parameter_sync_step`` steps. Staleness: per sync window the Rollouter may start at most
    ``floor((1 + staleness_threshold) * trigger_parameter_sync_step * require_batches * M)`` groups,
    counting the groups carried over from older weights; and no group whose oldest token is more
    than ``ceil(staleness_threshold)`` policy versions old is ever trained on (it is dropped, counted
    in ``rollouter/dropped_samples`` and its prompt regenerated). See docs/runners.md.
    """

    staleness_threshold: float = param(
        0.1,
        help="extra groups per sync window beyond what the trainer consumes, as a fraction of a window "
        "(K*R*M groups); 0 = on-policy pipelining",
    )
    trigger_parameter_sync_step: int = param(
        4, help="K: trainer steps between two weight pushes to the rollout backend"
    )
    require_batches: int = param(
        1, help="R: PPO mini-batches (of trainer.ppo_mini_batch_size prompts) per trainer step"
    )
    partial_rollout: bool = param(
        True,
        help="at a weight push, pause in-flight requests, keep their tokens and resume them under the new weights; "
        "false: stop admitting and let in-flight requests finish under the old weights first",
    )
    early_push: bool = param(
        False,
        help="push the weights on a background thread, right after the window's last update: the trainer's "
        "step tail (samples, metrics, checkpoint; without partial rollout also the drain) overlaps the push; the "
        "next batch waits for it. The pushed weights are the updated ones (docs/runners.md, 'Early push')",
    )
    total_rollout_steps: int | None = param(
        None,
        help="prompts (groups of rollout.n responses) the Rollouter draws in the whole run; the run trains "
        "total_rollout_steps // (R*M) steps. None: trainer.total_steps (or epochs) steps",
    )
    max_queue_size: int | None = param(
        None, help="groups queued or in flight at most (None: the window budget); must hold one trainer step"
    )
    wait_timeout_s: float = param(
        1800.0,
        help="seconds either side waits for the other without progress before failing with a TimeoutError",
    )
    scoring_workers: int = param(
        2,
        ge=1,
        help="chunks of finished samples scored at once, on threads beside the Rollouter (which keeps "
        "submitting prompts and reading the stream meanwhile); each chunk is scored by the reward manager, "
        "itself parallel within a chunk",
    )

    def step_plan(self, cfg: Any) -> StepPlan:
        """R x M prompts per trainer step, a push every K steps, ``total_rollout_steps // (R*M)`` steps."""
        step_groups = self.require_batches * mini_batch_groups(cfg)
        limit = None
        if self.total_rollout_steps is not None:
            limit = max(1, self.total_rollout_steps // step_groups)
        return StepPlan(step_groups, push_every=self.trigger_parameter_sync_step, step_limit=limit)

    def check(self, cfg: Any) -> list[str]:
        p, problems = self, _common_checks(cfg, "fully_async")
        key = "runner"
        if p.staleness_threshold < 0:
            problems.append(f"{key}.staleness_threshold: must be >= 0, got {p.staleness_threshold}")
        if p.trigger_parameter_sync_step < 1:
            problems.append(
                f"{key}.trigger_parameter_sync_step: must be >= 1, got {p.trigger_parameter_sync_step}"
            )
        if p.require_batches < 1:
            problems.append(f"{key}.require_batches: must be >= 1, got {p.require_batches}")
        if p.wait_timeout_s <= 0:
            problems.append(f"{key}.wait_timeout_s: must be > 0, got {p.wait_timeout_s}")
        m = max(1, mini_batch_groups(cfg))
        step_groups = max(1, p.require_batches) * m
        if p.require_batches > 1 and cfg.trainer.ppo_mini_batch_size is None:
            problems.append(
                f"trainer.ppo_mini_batch_size: {key}.require_batches={p.require_batches} needs the mini-batch size "
                "set (each trainer step is require_batches mini-batches of ppo_mini_batch_size prompts)"
            )
        budget = window_budget(
            max(0.0, p.staleness_threshold), max(1, p.trigger_parameter_sync_step), step_groups
        )
        if p.max_queue_size is not None and p.max_queue_size < step_groups:
            problems.append(
                f"{key}.max_queue_size: {p.max_queue_size} groups is smaller than one trainer step "
                f"({key}.require_batches={p.require_batches} x trainer.ppo_mini_batch_size={m} = {step_groups} "
                "prompts): the trainer would wait forever"
            )
        if budget < step_groups:  # cannot happen for threshold >= 0, kept as a guard
            problems.append(
                f"{key}.staleness_threshold: the window budget {budget} is below one step ({step_groups})"
            )
        if p.total_rollout_steps is not None:
            if p.total_rollout_steps < step_groups:
                problems.append(
                    f"{key}.total_rollout_steps: {p.total_rollout_steps} prompts is less than one trainer step "
                    f"({key}.require_batches x trainer.ppo_mini_batch_size = {step_groups} prompts)"
                )
            elif (
                cfg.trainer.total_steps is not None
                and cfg.trainer.total_steps != p.total_rollout_steps // step_groups
            ):
                problems.append(
                    f"trainer.total_steps: {cfg.trainer.total_steps} disagrees with {key}.total_rollout_steps="
                    f"{p.total_rollout_steps} // ({key}.require_batches x trainer.ppo_mini_batch_size = {step_groups}) "
                    f"= {p.total_rollout_steps // step_groups} steps; set only one of them"
                )
        rows = _dataset_rows(list(cfg.data.train_files))
        if rows is not None and rows < step_groups:
            problems.append(
                f"{key}.require_batches: {p.require_batches} x trainer.ppo_mini_batch_size={m} = {step_groups} prompts per "
                f"trainer step, but data.train_files hold only {rows} prompts"
            )
        rb = cfg.rollout.backend
        if rb is not None:
            if p.partial_rollout and not rb.capability("supports_partial_rollout"):
                problems.append(
                    f"{key}.partial_rollout: rollout backend {rb.name!r} lacks the supports_partial_rollout capability "
                    f"(it cannot pause and resume requests across a weight update); set {key}.partial_rollout=false"
                )
            if not rb.capability("supports_streaming"):
                problems.append(
                    f"rollout.backend: {rb.name!r} lacks the supports_streaming capability the fully_async runner "
                    "needs (samples one at a time as they finish)"
                )
        return problems


@dataclass(frozen=True)
class OneStepOffParams:
    """One-step-off-policy loop: generate batch t+1 (background thread) while training on batch t.

    Weights are pushed after every step, once the generation running beside it has finished, so
    every batch after the first is generated by weights exactly one policy version (one trainer
    step) older than the weights it is trained from. No request ever spans a weight update.
    """

    wait_timeout_s: float = param(
        1800.0,
        help="seconds the trainer waits for the background generation before failing with a TimeoutError",
    )

    def check(self, cfg: Any) -> list[str]:
        problems = _common_checks(cfg, "one_step_off")
        if self.wait_timeout_s <= 0:
            problems.append(f"runner.wait_timeout_s: must be > 0, got {self.wait_timeout_s}")
        return problems


@dataclass(frozen=True)
class SFTParams:
    """Supervised fine-tuning: each step trains on data.train_batch_size demonstrations (policy_loss: nll).

    A demonstrations file is Parquet with a ``messages`` column (a chat: the loss is on the
    assistant turns only, multi-turn and tool calls included) or ``prompt`` + ``response`` columns
    (a chat or text prompt and the assistant's reply). Conversations are rendered with the chat
    template code the multi-turn rollout uses (:mod:`rlzoo.agents.chat`), so the trained ids are
    the ids the policy sees and samples. The same loop as every runner: validation, checkpoints,
    resume, export, LoRA and every train backend; a demonstration is one sample (rollout.n: 1).
    Chain it before RL with ``stages`` (docs/distillation.md, "SFT and stages").
    """

    files: list[str] = param(
        [],
        help="Parquet files of demonstrations (a messages column, or prompt + response columns)",
    )
    messages_key: str = param("messages", help="column of chat messages (loss on the assistant turns)")
    prompt_key: str = param(
        "prompt", help="column of the prompt (chat messages or text) without messages_key"
    )
    response_key: str = param("response", help="column of the reply to prompt without messages_key")
    generate: int = param(
        0,
        ge=0,
        help="when files[0] does not exist, write this many demonstrations there first: the environment's "
        "own solutions (its solve(row), rlzoo.kernel.protocols.Demonstrates) of the first training rows; "
        "0: the files must exist",
    )

    def check(self, cfg: Any) -> list[str]:
        key = "runner"
        problems: list[str] = []
        if not self.files:
            problems.append(f"{key}.files: the sft runner needs at least one demonstrations file (Parquet)")
        if cfg.rollout.n != 1:
            problems.append(
                f"rollout.n: {cfg.rollout.n}, but the sft runner trains on one sample per demonstration (mini-batches "
                "count prompts x rollout.n); set rollout.n=1"
            )
        loss = cfg.algorithm.policy_loss
        if loss is not None and loss.caps.reads_advantages:
            problems.append(
                f"algorithm.policy_loss: {loss.name!r} reads advantages, which demonstrations do not have (the "
                "sft runner trains the likelihood of their tokens); select a loss that reads none, e.g. "
                "algorithm.policy_loss=nll"
            )
        if self.generate:
            if cfg.rollout.environment is None:
                problems.append(
                    f"{key}.generate: {self.generate} demonstrations are written by the environment's solve(row); "
                    "set rollout.environment (or give existing files and generate=0)"
                )
            if len(self.files) != 1:
                problems.append(f"{key}.generate: writes one file; give exactly one in {key}.files")
        elif cfg.data.prepare is None:
            missing = [f for f in self.files if not Path(f).expanduser().exists()]
            if missing:
                problems.append(
                    f"{key}.files: {', '.join(missing)} not found (set {key}.generate=N to have the environment "
                    "write N demonstrations there)"
                )
        return problems
