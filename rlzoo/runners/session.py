"""A training session: everything a runner needs, built once, in the order that fails fast.

Order: inputs are checked (data prepared if asked, model / tokenizer / dataset columns) before any
model is loaded; then datasets, reward manager, backends (through the placement), metrics, and the
checkpoint to resume from.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

from rlzoo.batch import Batch
from rlzoo.config import RecipeConfig, Selection
from rlzoo.errors import ConfigError
from rlzoo.metrics import MetricsLogger, PhaseTimer
from rlzoo.placement import make_placement
from rlzoo.protocols import RewardResult, Sample
from rlzoo.runners.common import (
    CheckpointManager,
    PolicyTrainer,
    build_datasets,
    build_reward_manager,
    check_inputs,
    ensure_data,
    load_processor,
    load_tokenizer,
    make_requests,
    rollout_metrics,
    rollout_spec,
    samples_to_batch,
    sampling_params,
    score_samples,
    train_spec,
    validation_metrics,
)

logger = logging.getLogger("rlzoo")


#: data key of a greedy-baseline sample: the request id whose samples it is the baseline for
BASELINE_OF = "greedy_baseline_of"


def filter_value(result: RewardResult, metric: str) -> float:
    """What a sample filter judges a sample by: ``reward``, ``score`` or a scorer's info key (``acc``)."""
    if metric == "reward":
        return float(result.reward)
    if metric == "score":
        return float(result.score)
    return float(result.info.get(metric, result.score))


class Session:
    """Built by a runner from a :class:`rlzoo.compose.Run`."""

    def __init__(self, run: Any, *, desc: str = "training") -> None:
        self.run = run
        cfg: RecipeConfig = run.config
        self.cfg = cfg
        self.run_dir: Path = run.make_run_dir()
        print(f"rlzoo: run directory {self.run_dir}", flush=True)
        torch.manual_seed(cfg.run.seed)
        ensure_data(cfg)
        check_inputs(cfg)
        self.tokenizer = load_tokenizer(cfg)
        self.processor = load_processor(cfg)  # None for a text model
        self.train_data, self.val_data = build_datasets(cfg, self.tokenizer, self.processor)
        from rlzoo.data.dataset import PromptLoader

        self.loader = PromptLoader(
            self.train_data, batch_size=cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.run.seed
        )
        per_epoch = max(1, len(self.train_data) // cfg.data.train_batch_size)
        self.total_steps = cfg.trainer.total_steps or per_epoch * cfg.trainer.total_epochs
        self.reward_manager = build_reward_manager(cfg)
        self.placement = make_placement(cfg)
        self.rollout_spec = rollout_spec(cfg, self.tokenizer)
        tb: Selection = cfg.trainer.backend
        rb: Selection = cfg.rollout.backend
        self.train_backend = self.placement.train_backend(
            tb, train_spec(cfg, self.total_steps, self.tokenizer)
        )
        self.rollout = self.placement.rollout_backend(rb, self.rollout_spec)
        self.trainer = PolicyTrainer(cfg, self.train_backend)
        self.ckpt = CheckpointManager(self.run_dir, cfg.trainer.max_checkpoints)
        self.start_step = 0
        self.resume_state: dict[str, Any] | None = None
        if cfg.resume:
            state = self.ckpt.load(self.train_backend)
            self.resume_state = state
            if state is None:
                raise ConfigError([f"resume: no complete checkpoint under {self.ckpt.root}"])
            self.start_step = int(state["step"])
            self.loader.load_state_dict(state["loader"])
            self.trainer.load_state_dict(state.get("trainer", {}))
            self.sync_weights()
            print(f"rlzoo: resumed from {self.ckpt.latest()} (step {self.start_step})", flush=True)
        self.metrics = MetricsLogger(
            self.run_dir,
            cfg.run.loggers,
            total_steps=self.total_steps,
            progress=cfg.run.progress,
            desc=desc,
            initial_step=self.start_step,
        )
        self.filter: Selection | None = cfg.algorithm.sample_filter
        self.greedy_baseline = bool(cfg.algorithm.advantage.capability("needs_greedy_baseline"))

    # -- pieces runners call --------------------------------------------------------------------
    def sync_weights(self) -> dict[str, float]:
        """Push the trainer's weights to the rollout backend; returns weight-sync metrics."""
        import time

        t0 = time.perf_counter()
        self.rollout.update_weights(self.train_backend.export_weights(), self.train_backend.version)
        out = {"weight_sync/seconds": time.perf_counter() - t0}
        stats = getattr(self.rollout, "last_sync", None)
        if stats is not None and hasattr(stats, "as_dict"):
            out.update({f"weight_sync/{k}": v for k, v in stats.as_dict().items()})
        return out

    def next_prompts(self) -> list[dict[str, Any]]:
        return list(next(self.loader))

    def score(self, samples: list[Sample]) -> list[RewardResult]:
        return score_samples(self.reward_manager, self.tokenizer, samples)

    def generate_groups(self, step: int, timer: PhaseTimer) -> tuple[Batch | None, dict[str, float]]:
        """One training batch of groups: generate, score, filter (refilling), greedy baselines.

        Returns no batch when a sample filter dropped every group (the step is skipped).
        """
        cfg = self.cfg
        want = cfg.data.train_batch_size
        kept_s: list[Sample] = []
        kept_r: list[RewardResult] = []
        rounds, dropped = 0, 0
        max_rounds = int(getattr(self.filter.params, "max_num_gen_batches", 0) or 0) if self.filter else 0
        extra: dict[str, float] = {}
        while True:
            rounds += 1
            items = self.next_prompts()
            sampling = sampling_params(cfg, seed=cfg.run.seed * 100_003 + step * 101 + rounds)
            reqs = make_requests(items, sampling, prefix=f"s{step}r{rounds}", processor=self.processor)
            if self.greedy_baseline:  # one greedy response per prompt, tagged with the request it serves
                greedy = dataclasses.replace(sampling_params(cfg, n=1, seed=0), greedy=True, temperature=1.0)
                greedy_reqs = make_requests(
                    items, greedy, prefix=f"s{step}r{rounds}g", processor=self.processor
                )
                for g, r in zip(greedy_reqs, reqs):
                    g.data[BASELINE_OF] = r.request_id
                reqs += greedy_reqs
            with timer("gen"):
                samples = self.rollout.generate(reqs)
            with timer("reward"):
                results = self.score(samples)
            if self.greedy_baseline:
                base = {
                    s.data[BASELINE_OF]: r.reward for s, r in zip(samples, results) if BASELINE_OF in s.data
                }
                pairs = [(s, r) for s, r in zip(samples, results) if BASELINE_OF not in s.data]
                for s, _ in pairs:
                    s.data["baseline_reward"] = base.get(s.request_id, 0.0)
                samples, results = [p[0] for p in pairs], [p[1] for p in pairs]
            if self.filter is not None:
                metric = getattr(self.filter.params, "metric", "reward")
                rewards = torch.tensor([filter_value(r, metric) for r in results], dtype=torch.float32)
                ids: dict[str, int] = {}
                gids = torch.tensor([ids.setdefault(s.request_id, len(ids)) for s in samples])
                keep = self.filter(rewards, gids).tolist()
                dropped += len({s.request_id for s, k in zip(samples, keep) if not k})
                samples = [s for s, k in zip(samples, keep) if k]
                results = [r for r, k in zip(results, keep) if k]
            kept_s += samples
            kept_r += results
            groups = len({s.request_id for s in kept_s})
            refills = self.filter is not None and self.filter.capability("refills")
            if not refills or groups >= want or (max_rounds and rounds >= max_rounds):
                break
        extra["rollout/gen_rounds"] = float(rounds)
        extra["rollout/dropped_groups"] = float(dropped)
        if not kept_s:
            # every group had zero reward variance (zero advantage: nothing to learn from)
            logger.warning(
                "step %d: the sample filter dropped all %d groups after %d generation round(s); skipping "
                "the update (raise max_num_gen_batches, or the data may be too hard / too easy)",
                step,
                dropped,
                rounds,
            )
            return None, extra
        order: dict[str, int] = {}
        for s in kept_s:
            order.setdefault(s.request_id, len(order))
        chosen = {rid for rid, i in order.items() if i < want}
        pairs = [(s, r) for s, r in zip(kept_s, kept_r) if s.request_id in chosen]
        samples, results = [p[0] for p in pairs], [p[1] for p in pairs]
        batch = samples_to_batch(
            samples,
            results,
            int(self.tokenizer.pad_token_id),
            max_response_length=cfg.data.max_response_length,
        )
        if self.greedy_baseline:
            batch["baseline_rewards"] = torch.tensor([s.data.get("baseline_reward", 0.0) for s in samples])
        extra.update(rollout_metrics(batch, cfg.data.max_response_length))
        return batch, extra

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
        results = self.score(samples)
        return validation_metrics(samples, results, sampling.n)

    def save(self, step: int) -> Path:
        return self.ckpt.save(
            step,
            self.train_backend,
            {"step": step, "loader": self.loader.state_dict(), "trainer": self.trainer.state_dict()},
        )

    def resume_hint(self) -> str:
        latest = self.ckpt.latest()
        if latest is None:
            return "rlzoo: interrupted before the first checkpoint; nothing to resume"
        recipe = self.cfg.recipe or "RECIPE"
        return (
            f"rlzoo: interrupted; the last checkpoint is {latest}. Resume with:\n"
            f"  rlzoo train {recipe} resume=true run.output_dir={self.run_dir}"
        )

    def close(self) -> None:
        self.metrics.close()
        for obj in (self.rollout, self.train_backend):
            shut = getattr(obj, "shutdown", None)
            if callable(shut):
                try:
                    shut()
                except Exception as exc:  # best effort on the way out
                    logger.warning("shutdown failed: %s", exc)
        self.placement.shutdown()
