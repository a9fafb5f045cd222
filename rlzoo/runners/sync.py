"""The synchronous runner: generate a whole batch, score it, train on it, push weights, repeat.

prompts -> rollout (n per prompt) -> rewards -> [filter / refill] -> old / ref log-probs, values
  -> advantages -> PPO epochs over mini-batches -> weight sync
validation before training and every ``trainer.test_freq`` steps; checkpoints every
``trainer.save_freq`` steps; ``resume=true run.output_dir=...`` continues from the latest one.
"""

from __future__ import annotations

import logging
from typing import Any

from rlzoo.metrics import PhaseTimer
from rlzoo.runners.common import write_summary
from rlzoo.runners.session import Session

logger = logging.getLogger("rlzoo")


def is_due(step: int, freq: int, total: int) -> bool:
    return step == total or (freq > 0 and step % freq == 0)


class SyncRunner:
    def __init__(self, params: Any, run: Any) -> None:
        self.params = params
        self.run_obj = run

    def run(self) -> dict[str, Any]:
        s = Session(self.run_obj, desc="sync")
        cfg = s.cfg
        last: dict[str, Any] = {}
        try:
            if cfg.trainer.val_before_train and s.start_step == 0 and s.val_data is not None:
                last.update(s.metrics.log(0, s.validate(), advance=False))
            for step in range(s.start_step + 1, s.total_steps + 1):
                timer = PhaseTimer()
                with timer("step"):
                    batch, m = s.generate_groups(step, timer)
                    if batch is not None:
                        m.update(s.trainer.step(batch, timer))
                        with timer("sync_weights"):
                            m.update(s.sync_weights())
                m["rollout/skipped_step"] = float(batch is None)
                if batch is not None:
                    m.update(step_perf(batch, timer))
                if s.val_data is not None and is_due(step, cfg.trainer.test_freq, s.total_steps):
                    with timer("testing"):
                        m.update(s.validate())
                    m["timing_s/testing"] = timer.seconds["testing"]
                if is_due(step, cfg.trainer.save_freq, s.total_steps):
                    with timer("save_checkpoint"):
                        s.save(step)
                    m["timing_s/save_checkpoint"] = timer.seconds["save_checkpoint"]
                last = s.metrics.log(step, m)
        except KeyboardInterrupt:
            s.metrics.write(s.resume_hint())
            raise
        finally:
            s.close()
        summary = {"run_dir": str(s.run_dir), "steps": s.total_steps, "final": last}
        write_summary(s.run_dir, summary)
        return summary


#: phases that are model compute (forward / backward / generation); the rest is framework overhead
COMPUTE_PHASES = ("gen", "old_log_prob", "ref", "values", "update_actor", "update_critic")


def step_perf(batch: Any, timer: PhaseTimer) -> dict[str, float]:
    out = timer.metrics()
    step_s = timer.seconds["step"]
    tokens = float(batch["attention_mask"].sum().item())
    out["perf/total_num_tokens"] = tokens
    out["perf/throughput"] = tokens / step_s if step_s > 0 else 0.0
    compute = sum(timer.seconds.get(p, 0.0) for p in COMPUTE_PHASES)
    other = step_s - compute - timer.seconds.get("reward", 0.0)
    out["perf/overhead_frac"] = max(0.0, other) / step_s if step_s > 0 else 0.0
    return out
