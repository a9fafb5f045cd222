"""quickstart_tools: held-out accuracy of a tiny model adding two 3-digit numbers, with the ``calc``
tool and without it, side by side (the issue's target: near 0 -> >= 0.8 within 5 minutes on 2
cores with the tool; low without).

Runs the ``quickstart_tools`` recipe twice, ``rollout.environment.with_tool=true`` and ``=false``,
one after the other (run it under the shared lock: ``flock /tmp/rlzoo-heavy.lock python
benchmarks/agents.py``), validating every 10 steps, and prints both validation curves with the
elapsed training time, then the agent metrics of the last step.

    python benchmarks/agents.py [--steps N] [extra overrides ...]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import rlzoo
from rlzoo.metrics import read_metrics


def run(tmp: str, with_tool: bool, steps: int, overrides: list[str]) -> list[dict[str, Any]]:
    name = "tool" if with_tool else "no_tool"
    r = rlzoo.build_run(
        "quickstart_tools",
        [
            f"data.dir={tmp}/data",
            f"run.output_dir={tmp}/{name}",
            "run.progress=false",
            "trainer.test_freq=10",
            f"trainer.total_steps={steps}",
            f"rollout.environment.with_tool={str(with_tool).lower()}",
            *overrides,
        ],
    )
    r.train()
    return read_metrics(r.run_dir)


def curve(recs: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """step -> (validation accuracy, training seconds so far)."""
    train = [r for r in recs if r["step"] > 0]
    t0 = train[0]["time"] - train[0]["timing_s/step"] if train else 0.0
    out = {}
    for r in recs:
        if "val/mean" in r:
            out[int(r["step"])] = (float(r["val/mean"]), 0.0 if r["step"] == 0 else r["time"] - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    args, overrides = ap.parse_known_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        tool = run(tmp, True, args.steps, overrides)
        no_tool = run(tmp, False, args.steps, overrides)
        wall = time.time() - t0
    a, b = curve(tool), curve(no_tool)
    print(f"load average at start: {load:.2f}; wall {wall:.0f} s for both runs")
    print(f"{'step':>5} | {'val acc (calc)':>14} {'train s':>8} | {'val acc (no tool)':>17} {'train s':>8}")
    for step in sorted(set(a) | set(b)):
        va, ta = a.get(step, (float("nan"), float("nan")))
        vb, tb = b.get(step, (float("nan"), float("nan")))
        print(f"{step:>5} | {va:>14.3f} {ta:>8.1f} | {vb:>17.3f} {tb:>8.1f}")
    for label, recs in (("calc", tool), ("no tool", no_tool)):
        last = [r for r in recs if r["step"] > 0][-1]
        keys = (
            "critic/score/mean",
            "agent/turns/mean",
            "agent/tool_calls/mean",
            "agent/tool_errors/mean",
            "agent/truncated_frac",
            "agent/model_tokens/mean",
            "agent/env_tokens/mean",
        )
        print(f"{label:>8} last step: " + ", ".join(f"{k}={last.get(k, float('nan')):.3g}" for k in keys))


if __name__ == "__main__":
    main()
