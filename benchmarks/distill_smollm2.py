"""A ~19M-parameter SmolLM2-shaped student: distilled on-policy from SmolLM2-135M against GRPO alone.

Makes the teacher first when it is missing (``$RLZOO_CACHE/smollm2_arith_teacher``, default
``~/.cache/rlzoo``: ``grpo_smollm2_arith`` for ``--teacher-steps`` steps, the folder the
``distill_smollm2_arith`` recipe's ``algorithm.teacher.model`` names; never overwritten), then the
teacher's demonstrations (``rlzoo eval`` of the teacher on the distinct training questions, then
``rlzoo prepare smollm2_arith_student teacher_answers=...``: the rows it answered right, with its
answers), both before the clock starts. Then runs, one
after the other (``--together``: both at once), each for the same wall-clock budget (``--minutes``,
from the process start: model loading and validations included, the run stopped by SIGTERM when the
budget is spent):

- ``distill_smollm2_arith``: the fresh student (``data.dir/student``, random weights) distilled from
  the teacher (GKD, beta 0): half the steps on its own samples, half on the teacher's demonstrations
  (``runner.on_policy_fraction: 0.5``, TRL GKD's lmbda with ``seq_kd``);
- the same fresh student trained by ``grpo_smollm2_arith``'s GRPO alone (its lr raised to the
  distillation recipe's: a fresh model, not a pretrained one, is trained).

Teacher and students are scored by the last number of the answer (``gsm8k`` scorer, ``flexible``:
both recipes' scorer; ``math``, math-verify, would also credit a restatement of the question, "To
find 24 + 22, we need ...", as ``24 + 22``). Prints one table: held-out greedy accuracy (the
64 held-out prompts) at every validation against minutes, the teacher's held-out accuracy by both
rules (from its validation samples), and the student's last value within the budget. The machine's
load average is sampled every 30 s (wall times on a shared machine are loaded).

    python benchmarks/distill_smollm2.py [--minutes 8] [--teacher-steps 10] [--out DIR] [--together]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlzoo.report.metrics import read_metrics

DISTILL = "distill_smollm2_arith"
LOADS: list[float] = []  # the 1-minute load average, every 30 s while students run


def cache_dir() -> Path:
    return Path(os.environ.get("RLZOO_CACHE", "~/.cache/rlzoo")).expanduser()


def start(recipe: str, overrides: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlzoo.cli", "train", recipe, "run.progress=false", *overrides]
    )


def stop_after(procs: list[subprocess.Popen], budget_s: float | None) -> float:
    """Wait for ``procs``; those still running after ``budget_s`` get SIGTERM (a clean stop: the loop
    writes its rows); returns the wall seconds."""
    t0 = time.time()
    while any(p.poll() is None for p in procs):
        LOADS.append(os.getloadavg()[0])
        left = 30.0 if budget_s is None else min(30.0, budget_s - (time.time() - t0))
        if left <= 0:
            break  # the budget is spent: every run still going is stopped now, together
        with contextlib.suppress(subprocess.TimeoutExpired):
            next(p for p in procs if p.poll() is None).wait(timeout=left)
    wall = time.time() - t0
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait()
    return wall


def train(recipe: str, overrides: list[str], budget_s: float | None = None) -> float:
    """``rlzoo train recipe overrides`` in a child process, stopped after ``budget_s``."""
    proc = start(recipe, overrides)
    wall = stop_after([proc], budget_s)
    if budget_s is None and proc.returncode != 0:
        raise SystemExit(f"rlzoo train {recipe} failed with exit code {proc.returncode}")
    return wall


def ensure_teacher(steps: int) -> Path:
    """The arithmetic-GRPO SmolLM2-135M's ``final/``, trained when missing (never overwritten)."""
    out = cache_dir() / "smollm2_arith_teacher"
    if (out / "final").is_dir():
        print(f"teacher: {out / 'final'} (already trained)")
        return out
    if out.exists():
        raise SystemExit(f"{out} exists but has no final/: finish it (resume=latest) or move it aside")
    wall = train(
        "grpo_smollm2_arith",
        [f"run.output_dir={out}", f"trainer.total_steps={steps}", f"trainer.test_freq={steps}"],
    )
    print(f"teacher: trained {out / 'final'} in {wall:.0f} s")
    return out


def ensure_demos(teacher: Path) -> Path:
    """``train_teacher.parquet`` of the distillation recipe's data folder, before the clock: the
    distinct training questions (``rlzoo prepare``), the teacher's greedy answers to them (``rlzoo
    eval``, resumed when already there), the rows it answered right with their answers."""
    from rlzoo.tasks._smollm2 import EVAL_OVERRIDES, QUESTIONS

    data = cache_dir() / "smollm2_arith"
    rlzoo = [sys.executable, "-m", "rlzoo.cli"]
    prepare = [
        *rlzoo,
        "prepare",
        "smollm2_arith_student",
        "--out",
        str(data),
        "max_operand=30",
        "val_size=64",
    ]
    t0 = time.time()
    subprocess.run(prepare, check=True)
    over = [o.format(questions=data / QUESTIONS) for o in EVAL_OVERRIDES]
    answers = data / "teacher_answers"
    ev = ["eval", str(teacher), "--recipe", "grpo_smollm2_arith", "--split", "train", "--batch", "64"]
    subprocess.run([*rlzoo, *ev, "--out", str(answers), "--no-progress", *over], check=True)
    subprocess.run([*prepare, f"teacher_answers={answers}"], check=True)
    print(f"demonstrations: {data / 'train_teacher.parquet'} ({time.time() - t0:.0f} s)")
    return data / "train_teacher.parquet"


def teacher_last_number(run_dir: Path) -> list[tuple[int, float]]:
    """(step, share of the held-out answers whose last number is the sum) at each teacher validation,
    from its validation samples (the students' rule; a teacher made before grpo_smollm2_arith scored
    the last number was validated by math-verify)."""
    import pyarrow.parquet as pq

    from rlzoo.algorithms.functional.scoring.gsm8k import extract_solution

    out = []
    for f in sorted((run_dir / "samples" / "val").glob("step_*.parquet")):
        rows = pq.read_table(f, columns=["prompt", "response"]).to_pylist()
        right = 0
        for r in rows:
            a, b = re.findall(r"What is (\d+) \+ (\d+)\?", r["prompt"])[-1]
            right += extract_solution(r["response"], "flexible") == str(int(a) + int(b))
        out.append((int(f.stem.split("_")[1]), right / len(rows)))
    return out


def val_curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, minutes since the run's first row's step began, held-out accuracy) at each validation."""
    rows = read_metrics(run_dir)
    if not rows:
        return []
    start = min(r["time"] - r.get("timing_s/step", 0.0) - r.get("timing_s/testing", 0.0) for r in rows)
    return [(int(r["step"]), (r["time"] - start) / 60, float(r["val/mean"])) for r in rows if "val/mean" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of each student run")
    ap.add_argument("--teacher-steps", type=int, default=10, help="GRPO steps of the teacher when it is made")
    ap.add_argument("--test-freq", type=int, default=5, help="validate the students every N steps")
    ap.add_argument("--out", default=None, help="folder of the student runs (default: a temporary one)")
    ap.add_argument(
        "--together",
        action="store_true",
        help="run both students at the same time (each gets half the machine)",
    )
    args = ap.parse_args()
    teacher = ensure_teacher(args.teacher_steps)
    teacher_val = [r["val/mean"] for r in read_metrics(teacher) if "val/mean" in r]
    teacher_strict = teacher_last_number(teacher)
    teacher_steps = max(int(r["step"]) for r in read_metrics(teacher))
    demos = ensure_demos(teacher / "final")
    out = Path(args.out or tempfile.mkdtemp(prefix="distill_smollm2-"))
    common = [
        f"trainer.test_freq={args.test_freq}",
        "trainer.val_before_train=true",
        "trainer.total_steps=100000",
    ]
    cfg: dict[str, Any] = {}
    runs = {
        "distilled": (
            DISTILL,
            [f"run.output_dir={out / 'distill'}", f"algorithm.teacher.model={teacher / 'final'}"],
        ),
        "GRPO alone": (
            "grpo_smollm2_arith",
            [
                f"run.output_dir={out / 'grpo'}",
                "data.prepare.name=smollm2_arith_student",
                "model.path=${data.dir}/student",
                "trainer.optim.lr=1.0e-3",
            ],
        ),
    }
    curves = {}
    if args.together:  # both at once: the same machine, the same load, the same minutes
        procs = [start(recipe, [*common, *extra]) for recipe, extra in runs.values()]
        wall = stop_after(procs, args.minutes * 60)
        cfg = dict.fromkeys(runs, wall)
    else:
        for label, (recipe, extra) in runs.items():
            cfg[label] = train(recipe, [*common, *extra], budget_s=args.minutes * 60)
    for label, (recipe, _) in runs.items():
        curves[label] = val_curve(out / ("distill" if recipe == DISTILL else "grpo"))
    print(
        f"\nheld-out accuracy (64 held-out sums, greedy); each student run {args.minutes:g} min of wall clock"
    )
    print(
        f"teacher (SmolLM2-135M, {teacher_steps} GRPO steps): held-out {teacher_val[0]:.3f} at step 0 -> "
        f"{teacher_val[-1]:.3f} by its recipe's scorer when it was trained"
        if teacher_val
        else "teacher: no validation recorded"
    )
    print(
        "teacher by the students' rule (last number): "
        + ", ".join(f"{v:.3f} at step {k}" for k, v in teacher_strict)
    )
    import pyarrow.parquet as pq

    print(f"demonstrations: {pq.read_metadata(demos).num_rows} training rows the teacher answered right")
    print("| run | step | minutes | held-out |")
    print("|---|---:|---:|---:|")
    for label, c in curves.items():
        for step, minutes, v in c:
            print(f"| {label} | {step} | {minutes:.1f} | {v:.3f} |")
    for label, c in curves.items():
        last = [v for _, m, v in c if m <= args.minutes]
        print(
            f"{label}: held-out {last[-1] if last else float('nan'):.3f} within {args.minutes:g} min "
            f"({cfg[label]:.0f} s wall)"
        )
    for label, (recipe, _) in runs.items():
        rows = [r for r in read_metrics(out / ("distill" if recipe == DISTILL else "grpo")) if r["step"] > 0]
        own = [r for r in rows if r.get("rollout/on_policy", 1.0) == 1.0 and "critic/score/mean" in r]
        k = max(1, len(own) // 4)
        line = f"{label}: {len(rows)} steps"
        if own:
            first, last = own[:k], own[-k:]
            mean = (
                sum(r["critic/score/mean"] for r in first) / k,
                sum(r["critic/score/mean"] for r in last) / k,
            )
            line += (
                f"; its own samples' score, first {k} vs last {k} such steps: {mean[0]:.3f} -> {mean[1]:.3f}"
            )
            if "actor/gkd_jsd" in own[0]:
                line += f"; GKD loss on them {own[0]['actor/gkd_jsd']:.2f} -> {own[-1]['actor/gkd_jsd']:.2f} nats/token"
        print(line)
    if LOADS:
        print(
            f"load average (1 min, every 30 s): mean {sum(LOADS) / len(LOADS):.1f}, min {min(LOADS):.1f}, "
            f"max {max(LOADS):.1f} on {os.cpu_count()} cores"
        )
    print(f"runs: {out}")


if __name__ == "__main__":
    main()
