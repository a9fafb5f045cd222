"""A few steps of ``quickstart_gateway`` on every runner, the agent the recipe's ``calc_agent`` (the
OpenAI SDK loop of ``rlzoo.tasks.calc_agent`` in the run's process; the same loop as a command, one
process per episode: tests/gateway/test_tools.py, test_async_resume.py; benchmarks/gateway.py
measures both) and the ``tool_arithmetic`` environment judging its episodes.

The gateway is each runner's batch source's rollout: episodes are played, their calls merged into
one trajectory each (no split), and a push never aborts a call (fully_async with partial rollout).
The tool's round trip is tests/gateway/test_tools.py's (a scripted engine: deterministic). The
recipe's SFT stage is left out (``stages=[]``): what runs here is its GRPO stage through the gateway."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlzoo
from rlzoo.report.metrics import read_metrics

pytest.importorskip("openai")

STEPS = 2
RUNNERS = {
    "sync": [],
    "one_step_off": ["runner=one_step_off"],
    "fully_async": [
        "runner={name:fully_async,staleness_threshold:0.5,trigger_parameter_sync_step:1,"
        "require_batches:1,partial_rollout:true}"
    ],
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quickstart_tools")


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_quickstart_gateway_trains_on_every_runner(runner: str, data_dir: Path, tmp_path: Path) -> None:
    run = rlzoo.build_run(
        "quickstart_gateway",
        [
            "stages=[]",
            f"data.dir={data_dir}",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
            "run.loggers=[jsonl]",
            f"trainer.total_steps={STEPS}",
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "data.train_batch_size=4",
            "trainer.ppo_mini_batch_size=4",
            "rollout.n=4",
            *RUNNERS[runner],
        ],
    )
    run.train()
    assert run.run_dir is not None
    recs = [r for r in read_metrics(run.run_dir) if r["step"] > 0]
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    for r in recs:
        assert r["reward/failed"] == 0
        assert r["agent/gateway/samples_per_episode"] == 1.0 and r["agent/gateway/splits"] == 0
        assert 1.0 <= r["agent/turns/mean"] <= 2.0
        assert r["agent/gateway/calls"] >= 16  # 16 episodes, one or two calls each
        assert r["agent/model_tokens/mean"] > 0
        assert "agent/env/call_match" in r  # the environment judged the episodes (its shaping's info)
