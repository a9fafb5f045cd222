"""Runs recorded for exact comparisons between runners (tests/sources): each step's batch as the
trainer got it, the update's numbers and the final weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from run_fixtures import build

from rlzoo.kernel.plugins import PluginManager


def recorded_run(pm: PluginManager, recipe: str, quickstart_dir: Path, run_dir: Path, *extra: str) -> Any:
    """Train; return each step's batch as the trainer got it (every tensor), the update's numbers
    (losses, grad norm, KL ...: everything but timings) and the final weights (``final/``)."""
    from safetensors.torch import load_file

    runner = build(pm, recipe, quickstart_dir, run_dir, *extra).loop()
    batches: list[dict[str, Any]] = []
    updates: list[dict[str, float]] = []
    step = runner.s.trainer.step

    def recorded(batch: Any, timer: Any) -> dict[str, float]:
        batches.append({k: v.clone() for k, v in batch.tensors.items()})
        m = step(batch, timer)
        updates.append({k: v for k, v in m.items() if not k.startswith(("timing_s/", "perf/"))})
        return m

    runner.s.trainer.step = recorded
    runner.run()
    return batches, updates, load_file(str(run_dir / "final" / "model.safetensors"))


def assert_identical(a: Any, b: Any, steps: int) -> None:
    import torch

    (ba, ua, wa), (bb, ub, wb) = a, b
    assert len(ba) == len(bb) == steps
    for t, (x, y) in enumerate(zip(ba, bb), start=1):
        assert sorted(x) == sorted(y), t
        for k in x:  # prompt ids, response ids, masks, rollout log-probs, scores ...
            assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), (t, k)
    assert ua == ub  # losses and every other number of each update, to the bit
    assert sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)
