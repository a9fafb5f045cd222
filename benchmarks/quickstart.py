"""The quickstart's learning target: training reward rises by >= +0.5 within 5 minutes of wall clock.

Runs the default `quickstart` recipe (exactly what `rlzoo train` runs) and prints the reward curve
(every 10 steps, rolling mean over 5 steps), the first-step reward, when the rolling mean first
reached first + 0.5, and validation accuracy.

    python benchmarks/quickstart.py [extra overrides ...]
"""

from __future__ import annotations

import sys
import tempfile
import time

import rlzoo
from rlzoo.metrics import read_metrics


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        run = rlzoo.build_run(
            "quickstart",
            [f"data.dir={tmp}/data", f"run.output_dir={tmp}/run", "run.progress=false", *sys.argv[1:]],
        )
        run.train()
        wall = time.time() - t0
        recs = read_metrics(run.run_dir)
    train = [r for r in recs if r["step"] > 0]
    start = train[0]["time"] - train[0]["timing_s/step"]
    rewards = [r["critic/score/mean"] for r in train]
    first = rewards[0]
    print(f"{'step':>5} {'reward(roll5)':>14} {'val':>6} {'elapsed s':>10}")
    hit = None
    for i, r in enumerate(train):
        roll = sum(rewards[max(0, i - 4) : i + 1]) / len(rewards[max(0, i - 4) : i + 1])
        if hit is None and i >= 4 and roll >= first + 0.5:
            hit = (r["step"], r["time"] - start)
        if r["step"] % 10 == 0 or "val/mean" in r:
            val = f"{r['val/mean']:.3f}" if "val/mean" in r else ""
            print(f"{r['step']:>5} {roll:>14.3f} {val:>6} {r['time'] - start:>10.1f}")
    print(
        f"first-step reward {first:.3f}; best rolling mean {max(sum(rewards[i : i + 5]) / 5 for i in range(len(rewards) - 4)):.3f}"
    )
    if hit:
        print(
            f"+0.5 over the first step reached at step {hit[0]} after {hit[1]:.0f} s of training (target: within 300 s)"
        )
    else:
        print("+0.5 over the first step NOT reached")
    print(f"total wall clock incl. data preparation and model loading: {wall:.0f} s")


if __name__ == "__main__":
    main()
