"""A training session: everything the loop needs, built once from a :class:`~rlzoo.train.inputs.RunInputs`.

:func:`open_session` is the edge: it locks the run directory (one writer), reads the recipe once
into :class:`~rlzoo.train.inputs.RunInputs` (:func:`~rlzoo.train.inputs.run_inputs`: inputs checked,
data prepared if asked, tokenizer, datasets, reward manager, before any model loads) and builds the
:class:`Session` from them. The session then builds the backends (through the placement), the
policy trainer, the checkpoint to resume from and the metrics (continuing from the checkpoint
step); it holds no recipe and reads none.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlzoo.data.dataset import PromptLoader
from rlzoo.distributed.worker_group import WeightHandle
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.protocols import (
    GenerationRequest,
    PromptLogProbSource,
    ReportsWeightSync,
    RewardResult,
    RolloutBackend,
    Sample,
)
from rlzoo.kernel.settings import StepPlan
from rlzoo.placement import make_placement
from rlzoo.report.metrics import MetricsLogger, missing_row
from rlzoo.system.failpoints import failpoint
from rlzoo.train.batching import make_requests
from rlzoo.train.checkpoint import CheckpointManager, RunLock, rewind_metrics, write_summary
from rlzoo.train.export import (
    HFExportable,
    copy_export,
    export_model,
    final_dir,
    step_dir,
    writable_export_dir,
)
from rlzoo.train.inputs import (
    AgentSetup,
    Data,
    Reward,
    RunInputs,
    Sampling,
    Schedule,
    run_inputs,
)
from rlzoo.train.rewards import keep_mask, score_samples, validation_metrics
from rlzoo.train.rundir import record_resume
from rlzoo.train.samples import SampleWriter
from rlzoo.train.update import PolicyTrainer
from rlzoo.train_kit.formulas import offpolicy_metrics
from rlzoo.train_kit.lora import base_model_fingerprint

if TYPE_CHECKING:
    from rlzoo.recipe.types import RecipeConfig

logger = logging.getLogger("rlzoo")


def open_session(config: RecipeConfig, run_dir: Path, lock: RunLock, resume_info: Any = None) -> Session:
    """The edge: the recipe read once, the session built from what was read. ``run_dir`` is claimed
    and ``lock`` (its one-writer lock) is held by the caller (:meth:`rlzoo.recipe.compose.Run.loop`);
    the session owns the lock from now on and releases it when it closes (here too, on a failure)."""
    try:
        print(f"rlzoo: run directory {run_dir}", flush=True)
        torch.manual_seed(config.run.seed)
        writable_export_dir(final_dir(run_dir))  # a user's file in final/: say so now, not at the end
        inputs = run_inputs(config, resume_info)
    except BaseException:
        lock.release()
        raise
    return Session(inputs, run_dir, lock)


@dataclass(frozen=True)
class Backends:
    """Where generation and training happen (built by the placement)."""

    placement: Any  # rlzoo.placement.LocalPlacement or rlzoo.distributed.ray_placement.RayPlacement
    train: Any  # the train backend (rlzoo.kernel.protocols.TrainBackend)
    engine: RolloutBackend  # the rollout backend: it takes the weights
    rollout: RolloutBackend  # what the batch sources generate with: the engine, or trajectories over it
    model_path: str  # the model they were built from (an HF export copies its other files)
    #: the ids that end a model's turn, and the multi-turn setup the rollout composes over the engine
    #: (None: single-turn): what a source that renders conversations itself (runner sft) lays them out with
    stop_ids: tuple[int, ...] = ()
    agent: AgentSetup | None = None
    #: the teacher's own engine of the rollout backend (algorithm.teacher.backend: rollout), a
    #: rlzoo.kernel.protocols.PromptLogProbSource; None: the train backend scores the teacher, or none
    teacher: Any = None


@dataclass(frozen=True)
class Resumed:
    """The checkpoint this run resumed from."""

    step: int
    payload: dict[str, Any]  # the loop's checkpoint payload (step, trainer, data, policy version ...)


class Session:
    """What the loop and the batch sources use, built from :class:`~rlzoo.train.inputs.RunInputs`.

    Batch sources (runners) use ``plan``, ``rollout``, ``make_loader``, ``train_requests``, ``score``,
    ``keep``, ``sync_weights`` / ``send_weights`` and ``pad_token_id``, and read the typed records
    ``schedule``, ``data``, ``sampling``, ``reward``, ``backends`` and ``resumed``; nothing on it is
    a recipe.

    Args:
        inputs: the recipe, read once (:func:`~rlzoo.train.inputs.run_inputs`).
        run_dir: the run directory, locked by ``lock`` (released by :meth:`close`).
    """

    def __init__(self, inputs: RunInputs, run_dir: Path, lock: RunLock) -> None:
        self.run_dir = run_dir
        self.lock = lock
        self.runner_name = inputs.runner_name
        self.resume_command = (
            f"rlzoo train {inputs.recipe or 'RECIPE'} resume=latest run.output_dir={run_dir}"
        )
        self.schedule: Schedule = inputs.schedule
        self.data: Data = inputs.data
        self.sampling: Sampling = inputs.sampling
        self.reward: Reward = inputs.reward
        self.reward.failures.open_log(run_dir)  # failures.jsonl: each distinct error's traceback
        self._closed = False
        try:
            self._build(inputs)
        except BaseException:
            self.close()
            raise

    def _build(self, inputs: RunInputs) -> None:
        setup = inputs.backends
        self.backends = self._build_backends(inputs)
        train = self.backends.train
        self.trainer: PolicyTrainer = setup.trainer.build(
            train, offpolicy_metrics=offpolicy_metrics, teacher=self.backends.teacher
        )
        spec = setup.train_spec
        self.ckpt = CheckpointManager(
            self.run_dir,
            inputs.max_checkpoints,
            keep_best=inputs.keep_best,
            base_model=None if spec.lora is None else base_model_fingerprint(spec.model_path),
        )
        self.resumed: Resumed | None = None
        moved: Path | None = None
        gap_row: dict[str, Any] | None = None
        if inputs.resume_at is not False:
            step = None if inputs.resume_at is None else int(inputs.resume_at)
            state = self.ckpt.load(train, step)
            if state is None:
                raise ConfigError(
                    [
                        f"resume: no complete checkpoint under {self.ckpt.root} (the run stopped before its "
                        "first checkpoint); start it again with run.overwrite=true, which moves this attempt "
                        "aside, or in another run.output_dir"
                    ],
                    header=f"cannot resume {self.run_dir}",
                )
            self.resumed = Resumed(int(state["step"]), state)
            start = self.resumed.step
            self.trainer.load_state_dict(state.get("trainer", {}))
            self.sync_weights()
            # a new branch from this checkpoint: the later checkpoints and metrics rows move aside
            failpoint("resume:loaded")
            branch = self.ckpt.branch_from(start)
            failpoint("resume:branched")
            moved = rewind_metrics(self.run_dir, start)
            gap_row = missing_row(self.run_dir, state.get("metrics_row"))  # killed before its row
            failpoint("resume:rewound")
            info = inputs.resume_info  # compose.Run: set by build_run on a resume
            if info is not None:  # recorded only now that the resume has happened
                record_resume(info, from_step=start, moved=[p for p in (branch, moved) if p])
                failpoint("resume:recorded")
            print(f"rlzoo: resumed from {state['path']} (step {start})", flush=True)
            if branch is not None:
                print(f"rlzoo: the checkpoints after step {start} moved to {branch}", flush=True)
        self.samples = SampleWriter(
            self.run_dir,
            inputs.samples,
            self.data.tokenizer,
            None if self.resumed is None else self.start_step,
        )
        self.metrics = MetricsLogger(
            self.run_dir,
            inputs.loggers,
            total_steps=self.schedule.total_steps,
            progress=inputs.progress,
            desc=self.runner_name,
            initial_step=self.start_step,
            purge_step=None if self.resumed is None else self.start_step + (gap_row is None),
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

    def _build_backends(self, inputs: RunInputs) -> Backends:
        """The placement's backends; what was built is shut down again when a later one fails."""
        setup = inputs.backends
        placement = make_placement(setup.placement)
        built: list[Any] = []
        try:
            train = placement.train_backend(setup.train, setup.train_spec)
            built.append(train)
            engine = placement.rollout_backend(setup.rollout, setup.rollout_spec)
            built.insert(0, engine)
            rollout = episode_rollout(engine, inputs)
            teacher = None
            if setup.teacher_spec is not None:  # a second engine of the rollout backend, beside the first
                teacher = placement.rollout_backend(setup.rollout, setup.teacher_spec)
                built.insert(0, teacher)
                if not isinstance(teacher, PromptLogProbSource):
                    raise TypeError(
                        f"rollout backend {setup.rollout.name!r} declares supplies_prompt_log_probs, but "
                        f"{type(teacher).__name__} has no prompt_log_probs(sequences, starts) "
                        "(rlzoo.kernel.protocols.PromptLogProbSource)"
                    )
        except BaseException:
            _shut_down(*built)
            placement.shutdown()
            raise
        return Backends(
            placement,
            train,
            engine,
            rollout,
            setup.rollout_spec.model_path,
            stop_ids=tuple(setup.rollout_spec.eos_token_ids),
            agent=setup.agent,
            teacher=teacher,
        )

    # -- what the runner API reads ----------------------------------------------------------------
    @property
    def plan(self) -> StepPlan:
        """How the run is cut into trainer steps (prompts per step, push cadence, step limit)."""
        return self.schedule.plan

    @property
    def rollout(self) -> RolloutBackend:
        """What batch sources generate with (submit / stream / generate / pause / resume / version)."""
        return self.backends.rollout

    @property
    def pad_token_id(self) -> int:
        return self.data.pad_token_id

    @property
    def start_step(self) -> int:
        """The step this run starts after (the resumed checkpoint's, else 0)."""
        return 0 if self.resumed is None else self.resumed.step

    # -- pieces the loop and the batch sources call ---------------------------------------------
    def make_loader(self, batch_size: int) -> Any:
        make_sampler = self.data.sampler
        return PromptLoader(
            self.data.train,
            batch_size=batch_size,
            shuffle=self.data.shuffle,
            seed=self.sampling.seed,
            sampler=make_sampler(self.data.train) if make_sampler is not None else None,
        )

    def sync_weights(self) -> dict[str, float]:
        """Push the trainer's weights to the rollout backend; returns weight-sync metrics."""
        t0 = time.perf_counter()
        pushed = self.send_weights(self.backends.train.version)
        out = {"weight_sync/seconds": time.perf_counter() - t0}
        if pushed is not None:
            out["perf/weight_push_bytes"] = float(pushed)
        return out

    def send_weights(self, version: int) -> int | None:
        """``engine.update_weights(train_backend.export_weights(), version)``; the bytes pushed when
        the export is a local stream of tensors (a whole model, or only a LoRA adapter); for a Ray
        handle the rollout group moves itself, the bytes its sync reports
        (:class:`~rlzoo.kernel.protocols.ReportsWeightSync`), if any."""
        engine = self.backends.engine
        exported = self.backends.train.export_weights()
        if not isinstance(exported, WeightHandle):
            counter = _ByteCounter(exported)
            engine.update_weights(counter, version)
            return counter.bytes
        engine.update_weights(exported, version)
        report = engine.last_sync if isinstance(engine, ReportsWeightSync) else {}
        return int(report["bytes"]) if "bytes" in report else None

    def train_requests(
        self, items: Sequence[dict[str, Any]], step: int, attempt: int, *, greedy: bool = False
    ) -> list[GenerationRequest]:
        """Requests of a training batch: seeds depend on (seed, step, generation round) only, so every
        runner generates the same responses for the same prompts."""
        processor = self.data.processor
        if greedy:
            sampling = dataclasses.replace(self.sampling.train, n=1, seed=0, greedy=True, temperature=1.0)
            return make_requests(items, sampling, prefix=f"s{step}r{attempt}g", processor=processor)
        seed = self.sampling.seed * 100_003 + step * 101 + attempt
        sampling = dataclasses.replace(self.sampling.train, seed=seed)
        return make_requests(items, sampling, prefix=f"s{step}r{attempt}", processor=processor)

    def score(self, samples: list[Sample]) -> list[RewardResult]:
        """Score training samples (failures counted by ``reward.failures``)."""
        results = score_samples(self.reward.manager, self.data.tokenizer, samples, self.reward.names)
        if not self.reward.failures.step_samples:  # the scored-streak backstop's unit
            self.reward.failures.step_samples = self.plan.prompts_per_step * self.sampling.train.n
        self.reward.failures.record(results)
        self.reward.failures.record_tools([s.agent for s in samples])
        self.reward.failures.check_scored()  # every scored sample failing for steps: abort, any runner
        return results

    def keep(self, samples: Sequence[Sample], results: Sequence[RewardResult]) -> list[bool]:
        """The sample filter's keep mask, judged on ``sample_filter.metric`` (all kept without a filter)."""
        flt = self.reward.sample_filter
        if flt is None:
            return [True] * len(samples)
        return keep_mask(flt, self.reward.filter_metric, samples, results)

    def validate(self, step: int | None = None) -> dict[str, float]:
        """Validation metrics; with ``step``, its samples are kept as ``samples/val/step_K.parquet``."""
        data = self.data
        if data.val is None:
            return {}
        items = [data.val[i] for i in range(len(data.val))]
        sampling = dataclasses.replace(self.sampling.val, seed=self.sampling.seed + 17)
        size = data.val_batch_size or len(items)
        samples: list[Sample] = []
        for start in range(0, len(items), size):
            chunk = items[start : start + size]
            samples += self.rollout.generate(
                make_requests(chunk, sampling, prefix=f"val{start}", processor=data.processor)
            )
        results = score_samples(self.reward.manager, data.tokenizer, samples)
        if step is not None:
            self.samples.write_val(step, samples, results)
        return validation_metrics(samples, results, sampling.n)

    def save(self, step: int, payload: dict[str, Any]) -> Path:
        return self.ckpt.save(step, self.backends.train, payload)

    # -- HF model folders (rlzoo.train.export; helper H3). Runners call this after each step's checkpoint.
    def export(self, step: int, total_steps: int) -> dict[str, float]:
        """Write the HF model folders due at ``step``: ``export/step_K/`` every ``run.export_every``
        steps, ``final/`` at ``total_steps``. Returns ``timing_s/export`` when something was written."""
        every = self.schedule.export_every
        targets = [step_dir(self.run_dir, step)] if every > 0 and step % every == 0 else []
        if step == total_steps:
            targets.append(final_dir(self.run_dir))
        if not targets:
            return {}
        train = self.backends.train
        if not isinstance(train, HFExportable):
            logger.warning("the train backend has no export_hf(): no HF folder written at step %d", step)
            return {}
        t0 = time.perf_counter()
        first = export_model(
            train,
            self.backends.model_path,
            targets[0],
            tokenizer=self.data.tokenizer,
            processor=self.data.processor,
            step=step,
        )
        for out in targets[1:]:  # the same weights: copy rather than gather again
            copy_export(first, out, step=step)
        return {"timing_s/export": time.perf_counter() - t0}

    def resume_hint(self) -> str:
        latest = self.ckpt.latest()
        if latest is None:
            return "rlzoo: interrupted before the first checkpoint; nothing to resume"
        return f"rlzoo: interrupted; the last checkpoint is {latest}. Resume with:\n  {self.resume_command}"

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
            "steps": self.schedule.total_steps,
            "start_step": self.start_step,
            "last_step": steps[-1]["step"] if steps else self.start_step,
            "first_reward": rewards[0] if rewards else None,
            "last_reward": rewards[-1] if rewards else None,
            "best_val": max(vals) if vals else None,
            "wall_s": wall_s,
            "ended": ended,
            "last_checkpoint": str(self.ckpt.latest()) if self.ckpt.latest() else None,
            "resume_command": self.resume_command,
            "final": rows[-1] if rows else {},
            **extra,
        }
        write_summary(self.run_dir, summary)
        return summary

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        samples: SampleWriter | None = getattr(self, "samples", None)
        if samples is not None:  # the loop flushed on a clean end; here: a failing or stopped run's
            try:
                samples.close()
            except Exception as exc:  # on the way out of a failing run: its own error is the one raised
                logger.error("rlzoo: %s", exc)
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.close()
        backends: Backends | None = getattr(self, "backends", None)
        if backends is not None:  # the multi-turn rollout shuts its engine down with it
            _shut_down(backends.teacher, backends.rollout, backends.train)
            backends.placement.shutdown()
        self.lock.release()


def episode_rollout(engine: RolloutBackend, inputs: RunInputs) -> RolloutBackend:
    """What generates a run's samples over ``engine`` (weights still go to ``engine``): the engine
    itself, multi-turn trajectories with the recipe's environment (``rollout.agent`` an environment
    kind), or a user's agent through the gateway. ``rlzoo eval`` builds its rollout here too."""
    setup, data = inputs.backends, inputs.data
    stop_ids = tuple(setup.rollout_spec.eos_token_ids)
    if setup.agent is not None:
        from rlzoo.agents.rollout import MultiTurnRollout

        agent = setup.agent
        return MultiTurnRollout(
            engine,
            agent.make_env,
            data.tokenizer,
            agent.settings,
            max_response_length=data.max_response_length,
            stop_ids=stop_ids,
            tools=agent.tools,
            template_kwargs=data.chat_template_kwargs,
            max_prompt_length=agent.max_prompt_length,
            env_name=agent.env_name,
        )
    if setup.gateway is not None:
        from rlzoo.gateway.rollout import GatewayRollout

        gw = setup.gateway
        return GatewayRollout(
            engine,
            gw.make_agent,
            data.tokenizer,
            gw.settings,
            gw.multi_turn,
            max_response_length=data.max_response_length,
            max_prompt_length=gw.max_prompt_length,
            stop_ids=stop_ids,
            agent_name=gw.agent_name,
            template_kwargs=data.chat_template_kwargs,
            make_env=gw.make_env,
            env_name=gw.env_name,
        )
    return engine


def _shut_down(*backends: Any) -> None:
    """Shut backends down, best effort: on the way out, a failure is logged."""
    for backend in backends:
        shut = getattr(backend, "shutdown", None)
        if callable(shut):
            try:
                shut()
            except Exception as exc:
                logger.warning("shutdown failed: %s", exc)


class _ByteCounter:
    """Passes ``(name, tensor)`` pairs through, adding up their bytes."""

    def __init__(self, named: Iterable[tuple[str, Any]]) -> None:
        self.named = named
        self.bytes = 0

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for name, t in self.named:
            self.bytes += t.numel() * t.element_size()
            yield name, t
