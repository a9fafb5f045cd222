"""The quickstart's learning targets: held-out validation accuracy >= 0.9 within 3 minutes of training
on 2 cores (and training reward up by >= +0.5), with an answer that depends on the prompt.

Runs the default `quickstart` recipe (exactly what `rlzoo train` runs, validating every 10 steps
here) and prints the reward curve (rolling mean over 5 steps) with validation accuracy, when
validation first reached 0.9 and the rolling reward first + 0.5, and the best a constant answer
could score on the validation prompts (the task is not solvable without reading the prompt).

    python benchmarks/quickstart.py [extra overrides ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import rlzoo
from rlzoo.report.metrics import read_metrics


def constant_answer_accuracy(val_file: Path) -> float:
    """The validation accuracy of the best policy that ignores the prompt (always the same answer)."""
    import pyarrow.parquet as pq

    truths = [r["reward_model"]["ground_truth"] for r in pq.read_table(val_file).to_pylist()]
    return max(Counter(truths).values()) / len(truths)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        run = rlzoo.build_run(
            "quickstart",
            [
                f"data.dir={tmp}/data",
                f"run.output_dir={tmp}/run",
                "run.progress=false",
                "trainer.test_freq=10",
                *sys.argv[1:],
            ],
        )
        run.train()
        wall = time.time() - t0
        recs = read_metrics(run.run_dir)
        constant = constant_answer_accuracy(Path(tmp) / "data" / "val.parquet")
    train = [r for r in recs if r["step"] > 0]
    start = train[0]["time"] - train[0]["timing_s/step"]
    rewards = [r["critic/score/mean"] for r in train]
    first = rewards[0]
    print(f"{'step':>5} {'reward(roll5)':>14} {'val':>6} {'elapsed s':>10}")
    hit = val_hit = None
    val0 = next((r["val/mean"] for r in recs if r["step"] == 0 and "val/mean" in r), None)
    if val0 is not None:
        print(f"{0:>5} {'':>14} {val0:>6.3f} {0.0:>10.1f}")
    for i, r in enumerate(train):
        roll = sum(rewards[max(0, i - 4) : i + 1]) / len(rewards[max(0, i - 4) : i + 1])
        if hit is None and i >= 4 and roll >= first + 0.5:
            hit = (r["step"], r["time"] - start)
        if val_hit is None and r.get("val/mean", 0.0) >= 0.9:
            val_hit = (r["step"], r["time"] - start)
        if r["step"] % 10 == 0 or "val/mean" in r:
            val = f"{r['val/mean']:.3f}" if "val/mean" in r else ""
            print(f"{r['step']:>5} {roll:>14.3f} {val:>6} {r['time'] - start:>10.1f}")
    print(
        f"first-step reward {first:.3f}; best rolling mean {max(sum(rewards[i : i + 5]) / 5 for i in range(len(rewards) - 4)):.3f}"
    )
    if hit:
        print(f"+0.5 over the first step reached at step {hit[0]} after {hit[1]:.0f} s of training")
    else:
        print("+0.5 over the first step NOT reached")
    if val_hit:
        print(
            f"validation accuracy >= 0.9 reached at step {val_hit[0]} after {val_hit[1]:.0f} s of training "
            "(target: within 180 s)"
        )
    else:
        print("validation accuracy >= 0.9 NOT reached")
    print(
        f"best constant answer on the validation prompts: {constant:.3f} (the answer depends on the prompt)"
    )
    print(f"total wall clock incl. data preparation and model loading: {wall:.0f} s")


if __name__ == "__main__":
    main()
