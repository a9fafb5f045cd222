"""A small staged run (sft -> grpo on quickstart_tools) for tests/recipe/test_stages.py, run as a
process so that RLZOO_KILL_AT can kill it (-9) mid-stage. argv: data dir, run dir, [resume]."""

from __future__ import annotations

import sys

import rlzoo
from rlzoo.recipe.config import load_config

STEPS = 4  # per stage; checkpoints every 2 steps

data_dir, run_dir = sys.argv[1], sys.argv[2]
resume = len(sys.argv) > 3
common = [f"data.dir={data_dir}", f"run.output_dir={run_dir}", "run.progress=false", "run.loggers=[jsonl]"]
if resume:
    run = rlzoo.build_run(None, ["resume=latest", f"run.output_dir={run_dir}"])
else:
    cfg = load_config(
        "quickstart_tools_sft",
        [
            *common,
            f"trainer.total_steps={STEPS}",
            "trainer.save_freq=2",
            "trainer.test_freq=2",
            "data.train_batch_size=8",
            "trainer.ppo_mini_batch_size=8",
            "rollout.n=4",
        ],
    )
    sft = cfg.stages[0]
    sft.overrides = [
        *sft.overrides,
        f"trainer.total_steps={STEPS}",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
    ]
    run = rlzoo.build_run(cfg)
run.train()
