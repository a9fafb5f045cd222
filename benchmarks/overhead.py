"""Framework overhead of the sync runner: share of step time outside model compute.

Runs the quickstart recipe (real parts, real tokenizer, real parquet) with a model of the chosen
size and prints, per phase, the mean seconds per step and its share of the step. "Compute" is
generation, log-prob / value forwards and the updates; everything else (collation, rewards,
advantages, weight sync, metrics) is overhead.

    python benchmarks/overhead.py                  # hidden 256, 4 layers, 20 steps
    python benchmarks/overhead.py --hidden 64 --layers 2 --steps 30
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import rlzoo
from rlzoo.report.metrics import read_metrics
from rlzoo.train.loop import COMPUTE_PHASES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--response-length", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        comp = rlzoo.get_plugin_manager().get("dataset", "quickstart")
        params = type(comp.default_params())(hidden_size=args.hidden, num_layers=args.layers)
        comp.load()(data, params)
        run = rlzoo.build_run(
            "quickstart",
            [
                f"data.dir={data}",
                f"run.output_dir={tmp}/run",
                "run.loggers=[jsonl]",
                "run.progress=false",
                f"trainer.total_steps={args.steps}",
                f"data.max_response_length={args.response_length}",
                "trainer.val_before_train=false",
                "trainer.save_freq=-1",
                "trainer.test_freq=-1",
            ],
        )
        run.train()
        recs = [r for r in read_metrics(run.run_dir) if r["step"] > 1]  # skip the warm-up step
    phases = sorted(
        {k.split("/", 1)[1] for r in recs for k in r if k.startswith("timing_s/")}
        - {"step", "save_checkpoint", "testing"}
    )
    step = sum(r["timing_s/step"] for r in recs) / len(recs)
    print(
        f"model hidden={args.hidden} layers={args.layers}, {len(recs)} steps, mean step {step * 1000:.1f} ms"
    )
    print(f"{'phase':<16}{'ms/step':>10}{'share':>9}  kind")
    accounted = 0.0
    for p in phases:
        v = sum(r.get(f"timing_s/{p}", 0.0) for r in recs) / len(recs)
        accounted += v
        kind = "compute" if p in COMPUTE_PHASES else ("scoring" if p == "reward" else "overhead")
        print(f"{p:<16}{v * 1000:>10.1f}{v / step:>9.1%}  {kind}")
    print(
        f"{'(unaccounted)':<16}{(step - accounted) * 1000:>10.1f}{(step - accounted) / step:>9.1%}  overhead"
    )
    over = sum(r["perf/overhead_frac"] for r in recs) / len(recs)
    print(f"framework overhead (everything but compute and scoring): {over:.1%} of step time (target < 5%)")


if __name__ == "__main__":
    main()
