"""The one-step-off runner: every batch after the first is exactly one version old; resume keeps prompts."""

from __future__ import annotations

import shutil
from pathlib import Path

from rlzoo.metrics import read_metrics
from rlzoo.plugins import PluginManager

from .conftest import SIM, build


def test_one_step_off_lags_one_version_and_resumes(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    common = ["runner=one_step_off", *SIM, "trainer.test_freq=-1", "trainer.save_freq=2"]
    build(pm, "quickstart", quickstart_dir, out, *common, "trainer.total_steps=3").train()
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert [r["staleness/max"] for r in recs] == [0.0, 1.0, 1.0]
    # one trainer step = ppo_epochs x (16 / 8) mini-batches = 2 optimizer steps of lag
    assert [r["rollout/backend_version_lag"] for r in recs] == [0.0, 2.0, 2.0]
    assert all(0.0 <= r["trainer/idle_ratio"] <= 1.0 for r in recs)
    # the checkpoint of step 2 was taken before batch 3 was drawn: resuming from it regenerates batch 3
    shutil.rmtree(out / "checkpoints" / "step_3")
    (out / "checkpoints" / "latest").write_text("step_2")
    build(pm, "quickstart", quickstart_dir, out, *common, "trainer.total_steps=4", "resume=true").train()
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2, 3, 3, 4]
    assert recs[2]["critic/score/mean"] == recs[3]["critic/score/mean"]  # same prompts, same seeds
