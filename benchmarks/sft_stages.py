"""SFT then GRPO against GRPO alone on quickstart_tools: optimizer steps to held-out accuracy >= 0.8.

    python benchmarks/sft_stages.py                 # both runs (GRPO alone: up to 200 steps)
    python benchmarks/sft_stages.py --staged-only   # only quickstart_tools_sft (RL alone: 130 steps
                                                    # this round, docs/agents.md)
    python benchmarks/sft_stages.py --out DIR       # a run already complete in DIR is read, not rerun

Prints one table: the held-out accuracy (val/mean, greedy) at every validation of each run, steps
counted across stages (the SFT stage's steps count), and the first step at which it reached the target.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import rlzoo
from rlzoo.report.metrics import read_metrics

TARGET = 0.8


def curve(run_dir: Path) -> list[tuple[int, str, float]]:
    rows = read_metrics(run_dir)
    return [
        (int(r["step"]), str(r.get("stage", "grpo")), float(r["val/mean"])) for r in rows if "val/mean" in r
    ]


def reached(points: list[tuple[int, str, float]]) -> int | None:
    return next((s for s, _, v in points if v >= TARGET), None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="folder of the runs (default: a temporary one)")
    ap.add_argument("--staged-only", action="store_true")
    ap.add_argument(
        "--grpo-only", action="store_true", help="only GRPO alone (e.g. beside a --staged-only run)"
    )
    ap.add_argument("--grpo-steps", type=int, default=200)
    ap.add_argument("--test-freq", type=int, default=10)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="sft_stages-"))
    common = ["run.progress=false", "run.loggers=[jsonl]", f"trainer.test_freq={args.test_freq}"]
    runs = {} if args.grpo_only else {"sft -> grpo": ("quickstart_tools_sft", out / "staged")}
    if not args.staged_only:
        runs["grpo alone"] = ("quickstart_tools", out / "grpo")
    curves = {}
    for label, (recipe, run_dir) in runs.items():
        if (run_dir / "summary.json").is_file() and '"completed"' in (run_dir / "summary.json").read_text():
            curves[label] = curve(run_dir)
            continue
        run = rlzoo.build_run(
            recipe, [*common, f"run.output_dir={run_dir}", f"trainer.total_steps={args.grpo_steps}"]
        )
        run.train()
        curves[label] = curve(run_dir)
    steps = sorted({s for c in curves.values() for s, _, _ in c})
    print(f"\nheld-out accuracy (quickstart_tools val, greedy); steps counted across stages; target {TARGET}")
    print("| step | " + " | ".join(curves) + " |")
    print("|---:|" + "---:|" * len(curves))
    for s in steps:
        cells = []
        for c in curves.values():
            hit = [f"{v:.2f} ({st})" for x, st, v in c if x == s]
            cells.append(hit[0] if hit else "")  # a stage's last validation, not the next one's first
        print(f"| {s} | " + " | ".join(cells) + " |")
    for label, c in curves.items():
        print(f"{label}: steps to >= {TARGET}: {reached(c)}")
    if args.staged_only:
        print("grpo alone: 130 steps (this round's figure, docs/agents.md)")


if __name__ == "__main__":
    main()
