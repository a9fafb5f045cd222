"""trainer.lora on ``placement.name=ray`` (split: trainer actor + rollout actor): the broadcast
weight sync carries the adapter alone and the rollout replica applies it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import free_cpus_after_release, ray_run_overrides

pytestmark = pytest.mark.ray
pytest.importorskip("peft")


def test_lora_on_ray_split_pushes_the_adapter(ray_cluster: Any, tmp_path: Path) -> None:
    import rlzoo
    from rlzoo.report.metrics import read_metrics

    run = rlzoo.build_run(
        "quickstart",
        ray_run_overrides(
            tmp_path,
            "placement.colocate=false",
            "trainer.lora.rank=4",
            "trainer.optim.lr=1e-2",
            "trainer.total_steps=2",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
        ),
    )
    summary = run.train()
    assert summary["final"]["step"] == 2
    # the rollout replica samples with the trainer's adapted policy: its log-probs agree
    assert abs(summary["final"]["rollout_corr/log_ppl_abs_diff"]) < 1e-4
    synced = [r["perf/weight_push_bytes"] for r in read_metrics(run.run_dir) if "perf/weight_push_bytes" in r]
    full = sum(f.stat().st_size for f in Path(run.config.model.path).expanduser().glob("*.safetensors"))
    assert synced and max(synced) < full / 3  # the adapter, not the model
    free_cpus_after_release(ray_cluster)  # the cluster as found, for the tests after this one
