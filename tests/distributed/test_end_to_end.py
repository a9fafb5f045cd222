"""The sync runner, unchanged, on ``placement.name=ray``: colocated and split, 2 steps each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import free_cpus_after_release, ray_run_overrides

pytestmark = pytest.mark.ray


@pytest.mark.parametrize(
    "placement",
    [
        ["placement.colocate=true"],  # 1 CPU worker hosts the trainer and the rollout replica
        ["placement.colocate=false", "placement.rollout.n_workers_per_node=2"],  # 1 trainer + 2 rollout
    ],
    ids=["colocated", "split"],
)
def test_quickstart_on_ray(ray_cluster: Any, tmp_path: Path, placement: list[str]) -> None:
    import rlzoo

    overrides = ray_run_overrides(
        tmp_path, "trainer.total_steps=2", "trainer.test_freq=0", "trainer.save_freq=0", *placement
    )
    run = rlzoo.build_run("quickstart", overrides)
    summary = run.train()
    final = summary["final"]
    assert summary["steps"] == 2 and final["step"] == 2
    # the rollout policy after the sync is the trainer's: rollout and trainer log-probs agree
    assert abs(final["rollout_corr/log_ppl_abs_diff"]) < 1e-4
    assert free_cpus_after_release(ray_cluster) == 4.0


def test_fully_async_on_ray_split(ray_cluster: Any, tmp_path: Path) -> None:
    """The fully-async runner drives a trainer pool and a rollout pool of Ray actors."""
    import rlzoo
    from rlzoo.report.metrics import read_metrics

    run = rlzoo.build_run(
        "quickstart_async",
        ray_run_overrides(
            tmp_path, "placement.colocate=false", "runner.total_rollout_steps=null", "trainer.total_steps=3"
        ),
    )
    summary = run.train()
    assert summary["final"]["step"] == 3
    recs = [r for r in read_metrics(run.run_dir) if r["step"] > 0]
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(r["staleness/max"] <= 1 for r in recs)
    assert all("trainer/idle_ratio" in r for r in recs)
    assert free_cpus_after_release(ray_cluster) == 4.0  # the cluster as found, for the tests after this one


def test_one_step_off_on_ray_split(ray_cluster: Any, tmp_path: Path) -> None:
    """One-step-off with the engine and the trainer in separate Ray worker processes: the batch of step
    k was generated with the weights of step k - 1 (staleness 1 after the first step)."""
    import rlzoo
    from rlzoo.report.metrics import read_metrics

    run = rlzoo.build_run(
        "quickstart",
        ray_run_overrides(
            tmp_path,
            "placement.colocate=false",
            "runner=one_step_off",
            "trainer.total_steps=3",
            "trainer.test_freq=0",
        ),
    )
    summary = run.train()
    assert summary["final"]["step"] == 3
    recs = [r for r in read_metrics(run.run_dir) if r["step"] > 0]
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert [r["staleness/max"] for r in recs] == [0.0, 1.0, 1.0]
    assert free_cpus_after_release(ray_cluster) == 4.0
