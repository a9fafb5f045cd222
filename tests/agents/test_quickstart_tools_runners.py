"""A few steps of the ``quickstart_tools`` recipe on every runner (sync, one_step_off, fully_async,
and fully_async with ``token_is``):
the multi-turn rollout is the batch source of each, the calc tool is called, and the agent metrics
are logged. No accuracy assertion (``benchmarks/agents.py`` prints the learning curves)."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlzoo
from rlzoo.report.metrics import read_metrics

STEPS = 3
RUNNERS = {
    "sync": [],
    "one_step_off": ["runner=one_step_off"],
    "fully_async": [
        "runner={name:fully_async,staleness_threshold:0.5,trigger_parameter_sync_step:1,"
        "require_batches:1,partial_rollout:true}"
    ],
}
#: fully_async with the off-policy correction benchmarks/agents.py --async measures (docs/agents.md)
RUNNERS["fully_async_tis"] = [*RUNNERS["fully_async"], "algorithm.rollout_correction.name=token_is"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quickstart_tools")


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_quickstart_tools_trains_on_every_runner(runner: str, data_dir: Path, tmp_path: Path) -> None:
    run = rlzoo.build_run(
        "quickstart_tools",
        [
            f"data.dir={data_dir}",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
            "run.loggers=[jsonl]",
            f"trainer.total_steps={STEPS}",
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "data.train_batch_size=8",
            "trainer.ppo_mini_batch_size=8",
            *RUNNERS[runner],
        ],
    )
    run.train()
    assert run.run_dir is not None
    recs = [r for r in read_metrics(run.run_dir) if r["step"] > 0]
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    for r in recs:
        # every trajectory has one or two turns, the call turn being followed by the tool's reply
        assert 1.0 <= r["agent/turns/mean"] <= 2.0
        assert r["agent/tool_calls/mean"] <= r["agent/turns/mean"]
        assert r["agent/model_tokens/mean"] > 0
    # the untrained model calls calc in some trajectories (its first word), and the tool answers
    assert sum(r["agent/tool_calls/mean"] for r in recs) > 0
    assert sum(r["agent/env_tokens/mean"] for r in recs) > 0
    # the environment's shaping is reported (the held-out metric reads "acc", the exact answer)
    assert all("agent/env/call_match" in r and "agent/env/answer_match" in r for r in recs)
    if runner == "fully_async_tis":  # the importance weights were applied to the stale samples
        assert all(0 < r["rollout_corr/rollout_is_mean"] <= 2.0 for r in recs)
