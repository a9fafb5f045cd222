"""A ``quickstart_tools`` run whose environment's ``step`` hangs for ever (synchronously): run as
a script by ``test_user_code.py``, which checks that the process ends on its own.

Usage: python _hang_forever_run.py DATA_DIR OUT_DIR"""

from __future__ import annotations

import sys
import threading
from typing import Any

import rlzoo
from rlzoo.kernel.protocols import AgentTurn, EnvStep
from rlzoo.tasks._tools import ToolArithmetic
from rlzoo.tasks.tools import ToolArithmeticParams


class HangsForEver(ToolArithmetic):
    def step(self, turn: AgentTurn) -> EnvStep:
        threading.Event().wait()  # never set
        raise AssertionError("unreachable")


class Plugin:
    @rlzoo.hookimpl
    def rlzoo_register_environments(self, registry: Any) -> None:
        registry.register(
            "hangs_for_ever",
            lambda params: HangsForEver(params),
            params=ToolArithmeticParams,
            capabilities={"offers_tools": True},
        )


if __name__ == "__main__":
    data_dir, out_dir = sys.argv[1:3]
    rlzoo.get_plugin_manager().register(Plugin(), name="hangs-for-ever")
    run = rlzoo.build_run(
        "quickstart_tools",
        [
            f"data.dir={data_dir}",
            f"run.output_dir={out_dir}",
            "run.progress=false",
            "run.loggers=[jsonl]",
            "trainer.total_steps=2",
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "data.train_batch_size=4",
            "trainer.ppo_mini_batch_size=4",
            "rollout.environment=hangs_for_ever",
            "rollout.multi_turn.env_timeout_s=1",
            "reward.max_failed_steps=0",
        ],
    )
    run.train()
    print(f"RUN_DIR={run.run_dir}", flush=True)
