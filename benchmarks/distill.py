"""distill_quickstart against GRPO from scratch: held-out accuracy per optimizer step, one table.

Trains the quickstart teacher first when it is missing (``$RLZOO_CACHE/quickstart_teacher``, default
``~/.cache/rlzoo``: the quickstart recipe for 80 steps, the folder the recipe's ``algorithm.teacher.model``
names), then runs the ``quickstart`` recipe (GRPO from scratch) and ``distill_quickstart`` (a fresh
student of the same size distilled from it) on the same prompts, validating often, and prints both
curves against optimizer steps, when each first reached 0.9 held-out, and the ratio (target: <= 1/3).
A control column runs GRPO with the distillation recipe's batch shape (64 prompts x n=4, mini-batches
of 32): the gain is the teacher's, not the shape's.

    python benchmarks/distill.py [--grpo-steps 60] [--distill-steps 20]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import rlzoo
from rlzoo.report.metrics import read_metrics

TARGET = 0.9


def cache_dir() -> Path:
    return Path(os.environ.get("RLZOO_CACHE", "~/.cache/rlzoo")).expanduser()


def ensure_teacher(tmp: Path) -> Path:
    """The trained quickstart teacher's final/ folder, trained here when missing (never overwritten)."""
    out = cache_dir() / "quickstart_teacher"
    if (out / "final").is_dir():
        print(f"teacher: {out / 'final'} (already trained)")
        return out / "final"
    if out.exists():
        raise SystemExit(f"{out} exists but has no final/: finish it (resume=latest) or move it aside")
    t0 = time.time()
    run = rlzoo.build_run(
        "quickstart",
        [
            f"data.dir={tmp}/teacher_data",
            f"run.output_dir={out}",
            "run.progress=false",
            "trainer.total_steps=80",
            "trainer.test_freq=20",
        ],
    )
    run.train()
    best = max((r["val/mean"] for r in read_metrics(run.run_dir) if "val/mean" in r), default=0.0)
    print(f"teacher: trained {out / 'final'} in {time.time() - t0:.0f} s (best held-out {best:.3f})")
    return out / "final"


def curve(
    recipe: str, tmp: Path, steps: int, test_freq: int, extra: list[str], name: str = ""
) -> tuple[dict[int, float], Any, float]:
    """{optimizer steps: held-out accuracy} of one run, its config and its wall time."""
    t0 = time.time()
    run = rlzoo.build_run(
        recipe,
        [
            f"data.dir={tmp}/data",
            f"run.output_dir={tmp}/{name or recipe}",
            "run.progress=false",
            f"trainer.total_steps={steps}",
            f"trainer.test_freq={test_freq}",
            *extra,
        ],
    )
    run.train()
    wall = time.time() - t0
    cfg = run.config
    per_step = cfg.trainer.ppo_epochs * (
        cfg.data.train_batch_size // (cfg.trainer.ppo_mini_batch_size or cfg.data.train_batch_size)
    )
    vals = {r["step"] * per_step: r["val/mean"] for r in read_metrics(run.run_dir) if "val/mean" in r}
    return vals, cfg, wall


def first_at(vals: dict[int, float]) -> int | None:
    return next((s for s in sorted(vals) if vals[s] >= TARGET), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grpo-steps", type=int, default=60, help="trainer steps of the GRPO run")
    ap.add_argument("--distill-steps", type=int, default=20, help="trainer steps of the distillation run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        teacher = ensure_teacher(tmp)
        grpo, gcfg, gwall = curve("quickstart", tmp, args.grpo_steps, 2, [])
        shape = ["data.train_batch_size=64", "rollout.n=4", "trainer.ppo_mini_batch_size=32"]
        ctrl, ccfg, cwall = curve("quickstart", tmp, args.grpo_steps, 2, shape, name="control")
        dist, dcfg, dwall = curve(
            "distill_quickstart", tmp, args.distill_steps, 1, [f"algorithm.teacher.model={teacher}"]
        )
    print()
    for name, cfg, wall in (("grpo", gcfg, gwall), ("control", ccfg, cwall), ("distill", dcfg, dwall)):
        print(
            f"{name:>8}: {cfg.data.train_batch_size} prompts x n={cfg.rollout.n} per trainer step, mini-batches of "
            f"{cfg.trainer.ppo_mini_batch_size} prompts, lr {cfg.trainer.optim.lr}, policy loss "
            f"{cfg.algorithm.policy_loss.name}; {wall:.0f} s wall (loaded 2-core machine)"
        )
    print(f"\n{'opt step':>8} {'grpo val':>9} {'control val':>12} {'distill val':>12}")
    for s in sorted(set(grpo) | set(ctrl) | set(dist)):
        g, c, d = (f"{v[s]:.3f}" if s in v else "" for v in (grpo, ctrl, dist))
        print(f"{s:>8} {g:>9} {c:>12} {d:>12}")
    g_hit, d_hit = first_at(grpo), first_at(dist)
    print(
        f"\nheld-out >= {TARGET}: GRPO at optimizer step {g_hit} (with distillation's shape: {first_at(ctrl)}), "
        f"distillation at {d_hit}",
        end="",
    )
    if g_hit and d_hit:
        print(f" (ratio {d_hit / g_hit:.2f}; target <= 0.33)")
    else:
        print(" (one of them never reached it: raise --grpo-steps / --distill-steps)")


if __name__ == "__main__":
    main()
