"""A training session: everything the loop needs, built once from the recipe, in the order that fails fast.

The session is the edge: it is the only place below :class:`rlzoo.recipe.compose.Run` that reads the
recipe. Order: the run directory is locked (one writer), inputs are checked (data prepared if
asked, model / tokenizer / dataset columns) before any model is loaded; then datasets, reward
manager, backends (through the placement), the policy trainer, the checkpoint to resume from, and
metrics (continuing from the checkpoint step).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from rlzoo.agents.chat import ChatTemplate
from rlzoo.data.dataset import PromptLoader
from rlzoo.distributed.worker_group import WeightHandle
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.protocols import GenerationRequest, JudgedMetric, ReportsWeightSync, RewardResult, Sample
from rlzoo.kernel.settings import StepPlan
from rlzoo.placement import make_placement
from rlzoo.recipe.types import RecipeConfig, Selection
from rlzoo.report.metrics import MetricsLogger, missing_row
from rlzoo.system.failpoints import failpoint
from rlzoo.train.batching import make_requests, sampling_params
from rlzoo.train.checkpoint import CheckpointManager, RunLock, rewind_metrics, write_summary
from rlzoo.train.export import (
    HFExportable,
    copy_export,
    export_model,
    final_dir,
    step_dir,
    writable_export_dir,
)
from rlzoo.train.failures import RewardFailures
from rlzoo.train.inputs import (
    build_datasets,
    check_inputs,
    ensure_data,
    load_processor,
    load_tokenizer,
    multi_turn_rollout,
    rollout_spec,
    train_spec,
)
from rlzoo.train.rewards import build_reward_manager, keep_mask, score_samples, validation_metrics
from rlzoo.train.rundir import record_resume
from rlzoo.train.update import PolicyTrainer
from rlzoo.train_kit.formulas import offpolicy_metrics

logger = logging.getLogger("rlzoo")


def resume_step(value: Any) -> int | bool | None:
    """``resume``: False (fresh run), True / ``latest`` (newest good checkpoint) or a step number."""
    if value is None or value is False or (isinstance(value, str) and value.lower() in ("", "false", "no")):
        return False
    if value is True or (isinstance(value, str) and value.lower() in ("true", "latest", "yes")):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(
            [f"resume: {value!r} is not true/false, 'latest' or a checkpoint step number"]
        ) from None


class Session:
    """Built by :func:`rlzoo.train.loop.train` from a :class:`rlzoo.recipe.compose.Run`.

    Args:
        run: the composed run.
        plan: how the run is cut into trainer steps (:func:`rlzoo.recipe.types.step_plan`).
    """

    def __init__(self, run: Any, plan: StepPlan) -> None:
        self.run = run
        cfg: RecipeConfig = run.config
        self.cfg = cfg
        self.plan = plan
        self.runner_name = cfg.runner.name if isinstance(cfg.runner, Selection) else "runner"
        self.run_dir: Path = run.make_run_dir()
        # make_run_dir took the one-writer lock; a run object without one gets it here
        self.lock = run.lock or RunLock(self.run_dir).acquire()
        self._closed = False
        try:
            self._build(cfg)
        except BaseException:
            self.close()
            raise

    def _build(self, cfg: RecipeConfig) -> None:
        print(f"rlzoo: run directory {self.run_dir}", flush=True)
        torch.manual_seed(cfg.run.seed)
        resume_at = resume_step(cfg.resume)

        writable_export_dir(final_dir(self.run_dir))  # a user's file in final/: say so now, not at the end
        ensure_data(cfg)
        check_inputs(cfg)
        self.tokenizer = load_tokenizer(cfg)
        self.processor = load_processor(cfg)  # None for a text model
        self.train_data, self.val_data = build_datasets(cfg, self.tokenizer, self.processor)
        per_epoch = max(1, len(self.train_data) // self.plan.prompts_per_step)
        if self.plan.step_limit is not None:
            self.total_steps = self.plan.step_limit
        else:
            self.total_steps = cfg.trainer.total_steps or per_epoch * cfg.trainer.total_epochs
        # flat settings the loop reads
        self.validate_before_train = cfg.trainer.val_before_train
        self.test_freq = cfg.trainer.test_freq
        self.save_freq = cfg.trainer.save_freq
        self.seed = cfg.run.seed
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.max_response_length = cfg.data.max_response_length
        self.rollout_n = cfg.rollout.n
        self.filter: Selection | None = cfg.algorithm.sample_filter
        flt = self.filter.params if self.filter else None
        self.filter_metric = flt.metric if isinstance(flt, JudgedMetric) else "reward"
        self.greedy_baseline = bool(cfg.algorithm.advantage.capability("needs_greedy_baseline"))
        self.reward_manager = build_reward_manager(cfg)
        self.reward_failures = RewardFailures(
            cfg.reward.max_failed_steps, cfg.reward.max_failed_frac
        )  # rlzoo.train.failures (H5)
        self.placement = make_placement(cfg)
        self.rollout_spec = rollout_spec(cfg, self.tokenizer)
        if (
            cfg.rollout.environment is not None
        ):  # a template that cannot do multi-turn fails before any model loads
            ChatTemplate(self.tokenizer, stop_ids=self.rollout_spec.eos_token_ids).probe()
        tb: Selection = cfg.trainer.backend
        rb: Selection = cfg.rollout.backend
        self.train_backend = self.placement.train_backend(
            tb, train_spec(cfg, self.total_steps, self.tokenizer)
        )
        # the engine takes the weights; the batch sources generate through ``rollout``: the engine
        # itself, or, multi-turn, the trajectories composed over it
        self.engine = self.placement.rollout_backend(rb, self.rollout_spec)
        self.rollout = self.engine
        if cfg.rollout.environment is not None:  # multi-turn: every batch source goes through it
            self.rollout = multi_turn_rollout(cfg, self.engine, self.tokenizer, self.rollout_spec)
        self.trainer = PolicyTrainer.from_config(cfg, self.train_backend, offpolicy_metrics=offpolicy_metrics)
        self.ckpt = CheckpointManager(
            self.run_dir, cfg.trainer.max_checkpoints, keep_best=cfg.trainer.keep_best
        )
        self.start_step = 0
        self.resume_payload: dict[str, Any] | None = None
        moved: Path | None = None
        gap_row: dict[str, Any] | None = None
        if resume_at is not False:
            step = None if resume_at is None else int(resume_at)
            state = self.ckpt.load(self.train_backend, step)
            if state is None:
                raise ConfigError(
                    [
                        f"resume: no complete checkpoint under {self.ckpt.root} (the run stopped before its "
                        "first checkpoint); start it again with run.overwrite=true, which moves this attempt "
                        "aside, or in another run.output_dir"
                    ]
                )
            self.resume_payload = state
            self.start_step = int(state["step"])
            self.trainer.load_state_dict(state.get("trainer", {}))
            self.sync_weights()
            # a new branch from this checkpoint: the later checkpoints and metrics rows move aside
            failpoint("resume:loaded")
            branch = self.ckpt.branch_from(self.start_step)
            failpoint("resume:branched")
            moved = rewind_metrics(self.run_dir, self.start_step)
            gap_row = missing_row(self.run_dir, state.get("metrics_row"))  # killed before its row
            failpoint("resume:rewound")
            info = self.run.resume_info  # compose.Run: set by build_run on a resume
            if info is not None:  # recorded only now that the resume has happened
                record_resume(info, from_step=self.start_step, moved=[p for p in (branch, moved) if p])
                failpoint("resume:recorded")
            print(f"rlzoo: resumed from {state['path']} (step {self.start_step})", flush=True)
            if branch is not None:
                print(f"rlzoo: the checkpoints after step {self.start_step} moved to {branch}", flush=True)
        self.metrics = MetricsLogger(
            self.run_dir,
            cfg.run.loggers,
            total_steps=self.total_steps,
            progress=cfg.run.progress,
            desc=self.runner_name,
            initial_step=self.start_step,
            purge_step=None if self.resume_payload is None else self.start_step + (gap_row is None),
            redone_from=None if moved is None else self.start_step + 1,
        )
        if moved is not None:
            self.metrics.write(f"rlzoo: metrics rows after step {self.start_step} moved to {moved.name}")
        if gap_row is not None:
            self.metrics.emit(gap_row, advance=False)
            self.metrics.write(
                f"rlzoo: step {self.start_step}'s metrics row was not written before the run stopped; "
                "written now from its checkpoint"
            )

    # -- pieces the loop and the batch sources call ---------------------------------------------
    def make_loader(self, batch_size: int) -> Any:
        return PromptLoader(
            self.train_data, batch_size=batch_size, shuffle=self.cfg.data.shuffle, seed=self.seed
        )

    def sync_weights(self) -> dict[str, float]:
        """Push the trainer's weights to the rollout backend; returns weight-sync metrics."""
        t0 = time.perf_counter()
        pushed = self.send_weights(self.train_backend.version)
        out = {"weight_sync/seconds": time.perf_counter() - t0}
        if pushed is not None:
            out["perf/weight_push_bytes"] = float(pushed)
        return out

    def send_weights(self, version: int) -> int | None:
        """``engine.update_weights(train_backend.export_weights(), version)``; the bytes pushed when
        the export is a local stream of tensors (a whole model, or only a LoRA adapter); for a Ray
        handle the rollout group moves itself, the bytes its sync reports
        (:class:`~rlzoo.kernel.protocols.ReportsWeightSync`), if any."""
        exported = self.train_backend.export_weights()
        if not isinstance(exported, WeightHandle):
            counter = _ByteCounter(exported)
            self.engine.update_weights(counter, version)
            return counter.bytes
        self.engine.update_weights(exported, version)
        report = self.engine.last_sync if isinstance(self.engine, ReportsWeightSync) else {}
        return int(report["bytes"]) if "bytes" in report else None

    def train_requests(
        self, items: Sequence[dict[str, Any]], step: int, attempt: int, *, greedy: bool = False
    ) -> list[GenerationRequest]:
        """Requests of a training batch: seeds depend on (seed, step, generation round) only, so every
        runner generates the same responses for the same prompts."""
        if greedy:
            sampling = dataclasses.replace(
                sampling_params(self.cfg, n=1, seed=0), greedy=True, temperature=1.0
            )
            return make_requests(items, sampling, prefix=f"s{step}r{attempt}g", processor=self.processor)
        sampling = sampling_params(self.cfg, seed=self.seed * 100_003 + step * 101 + attempt)
        return make_requests(items, sampling, prefix=f"s{step}r{attempt}", processor=self.processor)

    def score(self, samples: list[Sample]) -> list[RewardResult]:
        """Score training samples (counted by ``reward_failures``)."""
        results = score_samples(self.reward_manager, self.tokenizer, samples)
        self.reward_failures.record(results)
        return results

    def keep(self, samples: Sequence[Sample], results: Sequence[RewardResult]) -> list[bool]:
        """The sample filter's keep mask, judged on ``sample_filter.metric`` (all kept without a filter)."""
        if self.filter is None:
            return [True] * len(samples)
        return keep_mask(self.filter, self.filter_metric, samples, results)

    def validate(self) -> dict[str, float]:
        if self.val_data is None:
            return {}
        cfg = self.cfg
        items = [self.val_data[i] for i in range(len(self.val_data))]
        sampling = sampling_params(cfg, val=True, seed=cfg.run.seed + 17)
        size = cfg.data.val_batch_size or len(items)
        samples: list[Sample] = []
        for start in range(0, len(items), size):
            chunk = items[start : start + size]
            samples += self.rollout.generate(
                make_requests(chunk, sampling, prefix=f"val{start}", processor=self.processor)
            )
        results = score_samples(self.reward_manager, self.tokenizer, samples)
        return validation_metrics(samples, results, sampling.n)

    def save(self, step: int, payload: dict[str, Any]) -> Path:
        return self.ckpt.save(step, self.train_backend, payload)

    # -- HF model folders (rlzoo.train.export; helper H3). Runners call this after each step's checkpoint.
    def export(self, step: int, total_steps: int) -> dict[str, float]:
        """Write the HF model folders due at ``step``: ``export/step_K/`` every ``run.export_every``
        steps, ``final/`` at ``total_steps``. Returns ``timing_s/export`` when something was written."""
        every = self.cfg.run.export_every
        targets = [step_dir(self.run_dir, step)] if every > 0 and step % every == 0 else []
        if step == total_steps:
            targets.append(final_dir(self.run_dir))
        if not targets:
            return {}
        if not isinstance(self.train_backend, HFExportable):
            logger.warning("the train backend has no export_hf(): no HF folder written at step %d", step)
            return {}
        t0 = time.perf_counter()
        src = self.rollout_spec.model_path
        first = export_model(
            self.train_backend,
            src,
            targets[0],
            tokenizer=self.tokenizer,
            processor=self.processor,
            step=step,
        )
        for out in targets[1:]:  # the same weights: copy rather than gather again
            copy_export(first, out, step=step)
        return {"timing_s/export": time.perf_counter() - t0}

    def resume_command(self) -> str:
        recipe = self.cfg.recipe or "RECIPE"
        return f"rlzoo train {recipe} resume=latest run.output_dir={self.run_dir}"

    def resume_hint(self) -> str:
        latest = self.ckpt.latest()
        if latest is None:
            return "rlzoo: interrupted before the first checkpoint; nothing to resume"
        return f"rlzoo: interrupted; the last checkpoint is {latest}. Resume with:\n  {self.resume_command()}"

    def finish(
        self, rows: list[dict[str, Any]], *, wall_s: float, ended: str, extra: dict[str, Any]
    ) -> dict[str, Any]:
        """The end-of-run summary: written to ``summary.json`` and returned."""
        steps = [r for r in rows if r.get("step", 0) > 0]
        rewards = [r["critic/score/mean"] for r in steps if isinstance(r.get("critic/score/mean"), float)]
        vals = [r["val/mean"] for r in rows if isinstance(r.get("val/mean"), float)]
        summary: dict[str, Any] = {
            "run_dir": str(self.run_dir),
            "runner": self.runner_name,
            "steps": self.total_steps,
            "start_step": self.start_step,
            "last_step": steps[-1]["step"] if steps else self.start_step,
            "first_reward": rewards[0] if rewards else None,
            "last_reward": rewards[-1] if rewards else None,
            "best_val": max(vals) if vals else None,
            "wall_s": wall_s,
            "ended": ended,
            "last_checkpoint": str(self.ckpt.latest()) if self.ckpt.latest() else None,
            "resume_command": self.resume_command(),
            "final": rows[-1] if rows else {},
            **extra,
        }
        write_summary(self.run_dir, summary)
        return summary

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.close()
        for obj in (getattr(self, "rollout", None), getattr(self, "train_backend", None)):
            shut = getattr(obj, "shutdown", None)
            if callable(shut):
                try:
                    shut()
                except Exception as exc:  # best effort on the way out
                    logger.warning("shutdown failed: %s", exc)
        placement = getattr(self, "placement", None)
        if placement is not None:
            placement.shutdown()
        self.lock.release()
        if getattr(self.run, "lock", None) is self.lock:
            self.run.lock = None


class _ByteCounter:
    """Passes ``(name, tensor)`` pairs through, adding up their bytes."""

    def __init__(self, named: Iterable[tuple[str, Any]]) -> None:
        self.named = named
        self.bytes = 0

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for name, t in self.named:
            self.bytes += t.numel() * t.element_size()
            yield name, t
