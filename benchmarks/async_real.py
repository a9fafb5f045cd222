"""Real overlap on a CPU: sync vs one-step-off vs fully-async with a real model, same cores. Prints a table.

    python benchmarks/async_real.py [--steps 8] [--recipe grpo_smollm2_count] [--configs sync,fa_partial]

Unlike ``benchmarks/async_sim.py`` nothing is simulated: the recipe's native engine generates and the
native trainer trains (SmolLM2-135M-Instruct on ``smollm2_count`` by default: answers from a few tokens
to 256, EOS honoured). Every config gets the same cores (``--cpus``, default all of this machine):

- **sync**: one process, rollout and training alternate, torch using every core (``sync``; the
  recipe's padding-free update, ``sync_padded`` without it, ``sync_mb32`` with micro-batches of 32
  instead of the chosen size) or one thread (``sync_1thread``: on a
  loaded machine torch's threads contend, and one thread can be faster);
- **one_step_off** and **fully_async**: ``placement.name=ray, colocate=false``: the rollout engine and
  the trainer are two Ray worker processes, weights pushed between them after each sync window, as
  on GPUs. ``one_step_off`` / ``fa_partial`` / ``fa_no_partial`` halve the cores (torch threads = half
  each); ``osf_shared`` / ``fa_shared`` / ``fa_shared_no_partial`` share them
  (``placement.trainer.threads`` = every core, ``placement.rollout.threads=1``: the engine's decode
  steps gain little from a second thread, and the OS hands the trainer the engine's core whenever the
  engine waits).

Columns: trained samples/s over the steady state (after the first step, whose time includes starting
the workers and the first full batch, and without the end-of-run validation / export / checkpoint),
its ratio to the faster sync, trained response tokens/s and its ratio (a window that trains shorter
answers gains samples/s, not tokens/s), the trainer's idle ratio measured the seed's way (share of the
trainer's wall-clock spent waiting on the queue; for sync, the share spent generating and scoring),
cores busy over the steady state (``/proc/stat``, the whole machine: state the load) and the CPU
seconds each trained sample cost, mean reward per trained sample (all steps, and the last half),
the reward curve against sync's (the largest gap over windows of a quarter of the steps, and the
gap of the last halves: the issue's "within 0.05"), staleness, partial ratio. Below the table: the
ceiling of overlap (sync's idle cores are all any runner doing the same work can reclaim), the
reward curve per sample consumed and the mean response length of each step for each config.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def configs(cpus: int) -> dict[str, list[str]]:
    split = [
        "placement.name=ray",
        "placement.colocate=false",
        "placement.trainer.n_workers_per_node=1",
        "placement.rollout.n_workers_per_node=1",
    ]

    def fa(partial: bool, s: float = 0.5, k: int = 1, r: int = 1) -> list[str]:
        return [
            *split,
            "~runner",
            f"+runner={{name:fully_async,staleness_threshold:{s},trigger_parameter_sync_step:{k},"
            f"require_batches:{r},partial_rollout:{str(partial).lower()}}}",
        ]

    # the cores shared, not halved: the trainer's torch uses every core, the rollout engine one thread
    # (its decode steps are Python-bound and gain nothing from a second); the OS gives the trainer the
    # rollout's core whenever the engine waits (staleness bound reached, weights being pushed)
    shared = [f"placement.trainer.threads={cpus}", "placement.rollout.threads=1"]
    return {
        "sync": ["runner=sync"],
        "sync_padded": ["runner=sync", "trainer.backend.use_remove_padding=false"],
        "sync_mb32": ["runner=sync", "trainer.micro_batch.size=32", "trainer.micro_batch.log_prob_size=32"],
        "sync_1thread": ["runner=sync", "+threads=1"],
        "one_step_off": [*split, "runner=one_step_off"],
        "fa_partial": fa(True),
        "fa_no_partial": fa(False),
        "osf_shared": [*split, *shared, "runner=one_step_off"],
        "fa_shared": [*fa(True, s=1.0), *shared],
        "fa_shared_no_partial": [*fa(False, s=1.0), *shared],
    }


# end-of-run work the last metrics row's time includes (the final validation, the HF export, the last
# checkpoint): the same for every runner and not training, so not in the steady state
END_OF_RUN = ("timing_s/testing", "timing_s/export", "timing_s/save_checkpoint")


def steady_rate(recs: list[dict[str, Any]], per_step: int) -> float:
    """Trained samples per second after the first step (which pays for starting up), without the
    end-of-run work in the last row."""
    if len(recs) < 2:
        return float("nan")
    t0, t1 = steady_window(recs)
    span = t1 - t0
    return per_step * (len(recs) - 1) / span if span > 0 else float("nan")


class CpuSampler:
    """The machine's busy CPU time (``/proc/stat``: every core, every process) sampled each second on a
    thread, so a config's steady-state window can be read back as *cores busy*: the work it had the
    cores do. Sync's idle share is what any overlap could at most reclaim: no runner doing the same
    work per sample can beat sync by more than ``cores / cores busy`` (plus what it saves in work:
    CPU seconds per sample, also printed)."""

    def __init__(self) -> None:
        import threading

        self.samples: list[tuple[float, float]] = []  # (time, busy CPU seconds summed over cores)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def read() -> float:
        """Busy CPU seconds since boot, summed over cores (all but idle and iowait)."""
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
        return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self.read()))
            self._stop.wait(1.0)

    def busy_cores(self, t0: float, t1: float) -> float:
        """Mean cores busy between wall-clock times t0 and t1 (nan without samples in between)."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return float("nan")
        (ta, ba), (tb, bb) = inside[0], inside[-1]
        return (bb - ba) / (tb - ta) if tb > ta else float("nan")

    def stop(self) -> None:
        self._stop.set()


def steady_window(recs: list[dict[str, Any]]) -> tuple[float, float]:
    """The wall-clock window of the steady state (after the first row, without the end-of-run work)."""
    return recs[0]["time"], recs[-1]["time"] - sum(recs[-1].get(k, 0.0) for k in END_OF_RUN)


def idle_ratio(recs: list[dict[str, Any]]) -> float:
    steady = recs[1:] or recs
    if "trainer/idle_ratio" in steady[0]:
        return statistics.mean(r["trainer/idle_ratio"] for r in steady)
    # sync: the trainer's share of the step spent waiting for generation and scoring
    return statistics.mean(
        (r.get("timing_s/gen", 0.0) + r.get("timing_s/reward", 0.0)) / r["timing_s/step"] for r in steady
    )


def train_config(extra: list[str], args: argparse.Namespace, run_dir: Path) -> float:
    """Train one config (in a process of its own: :func:`run_one`); returns the wall seconds of ``train()``."""
    import rlzoo

    split = "placement.name=ray" in extra
    threads = next((int(e.split("=")[1]) for e in extra if e.startswith("+threads=")), args.cpus)
    extra = [e for e in extra if not e.startswith("+threads=")]
    overrides = [
        f"run.output_dir={run_dir}",
        "run.progress=false",
        "run.loggers=[jsonl]",
        "run.samples.every=0",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.save_freq=-1",
        f"trainer.total_steps={args.steps}",
        f"data.train_batch_size={args.prompts}",
        f"trainer.ppo_mini_batch_size={args.prompts}",
        f"rollout.n={args.n}",
        *args.override,
        *extra,
    ]
    started_ray = False
    if split:  # two worker processes, half the cores each
        import ray

        if not ray.is_initialized():
            half = max(1, args.cpus // 2)
            # Ray starts its workers at nice 15 by default: on a machine shared with anything else they
            # would lose every contest for the cores to the sync run's unniced process
            os.environ.setdefault("RAY_worker_niceness", "0")
            ray.init(
                num_cpus=2 * half,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"OMP_NUM_THREADS": str(half), "TOKENIZERS_PARALLELISM": "false"}},
            )
            started_ray = True
    else:
        import torch

        torch.set_num_threads(threads)
    try:
        run = rlzoo.build_run(args.recipe, overrides)
        t0 = time.perf_counter()
        run.train()
        wall = time.perf_counter() - t0
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    return wall


def curve_gap(row: dict[str, Any], base: dict[str, Any] | None) -> str:
    """The reward curve per sample against sync's at the same samples consumed: the largest gap of
    their means over windows of a quarter of the steps (one step's batch of 32 is too noisy to
    compare: its mean's standard error is ~0.05 here), and the gap of the last halves."""
    if base is None or row is base:
        return "-"
    a, b = [s for _, s in row["curve"]], [s for _, s in base["curve"]]
    n = min(len(a), len(b))
    w = max(1, n // 4)
    gaps = [
        abs(statistics.mean(a[i : i + w]) - statistics.mean(b[i : i + w])) for i in range(0, n - w + 1, w)
    ]
    return f"max {max(gaps):.3f} / last half {row['reward_late'] - base['reward_late']:+.3f}"


def run_one(
    name: str, extra: list[str], args: argparse.Namespace, out: Path, cpu: CpuSampler
) -> dict[str, Any]:
    """One config in a fresh process (its memory and threads its own, as a user's run), then its row."""
    import subprocess
    import sys

    from rlzoo.report.metrics import read_metrics

    run_dir = out / name
    cmd = [sys.executable, __file__, "--child", name, "--child-dir", str(run_dir), *sys.argv[1:]]
    subprocess.run(cmd, check=True)
    wall = float((run_dir / "wall_s").read_text())
    recs = [r for r in read_metrics(run_dir) if r["step"] >= 1]
    per_step = args.prompts * args.n
    scores = [r["critic/score/mean"] for r in recs]
    half = scores[len(scores) // 2 :]
    rate = steady_rate(recs, per_step)
    busy = cpu.busy_cores(*steady_window(recs)) if len(recs) > 1 else float("nan")
    steady = recs[1:] or recs  # the steps the rate counts
    return {
        "name": name,
        "samples_s": rate,
        # trained response tokens a second: a runner that trains shorter answers in the window (the
        # long ones still decoding when it ends) gains samples/s, not tokens/s
        "tokens_s": rate * statistics.mean(r["response_length/mean"] for r in steady),
        "busy_cores": busy,
        "cpu_s_per_sample": busy / rate,
        "idle": idle_ratio(recs),
        "reward": statistics.mean(scores),
        "reward_late": statistics.mean(half),
        "curve": [(per_step * (i + 1), s) for i, s in enumerate(scores)],
        "lengths": [r["response_length/mean"] for r in recs],
        "len_mean": statistics.mean(r["response_length/mean"] for r in recs),
        "stale_mean": statistics.mean(r.get("staleness/mean", 0.0) for r in recs),
        "partial": statistics.mean(r.get("rollout/partial_ratio", 0.0) for r in recs),
        "wall": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="grpo_smollm2_count", help="base recipe (its task, model, settings)")
    ap.add_argument("--steps", type=int, default=8, help="trainer steps per config")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per trainer step")
    ap.add_argument("--n", type=int, default=4, help="responses per prompt")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="cores for every config")
    ap.add_argument("--configs", default="", help="comma-separated config names to run (default: all)")
    ap.add_argument("--json", default="", help="also write the rows to this JSON file")
    ap.add_argument("override", nargs="*", help="recipe overrides for every config (key=value)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)  # one config, in its own process
    ap.add_argument("--child-dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()

    from rlzoo.system.threads import choose_wait_policy

    # before torch is imported and before Ray starts its workers, so every config (the sync process and
    # the Ray workers, which inherit this environment) waits at its barriers the same way
    choose_wait_policy()
    import logging

    logging.getLogger("rlzoo").setLevel(logging.WARNING)
    if args.child:
        run_dir = Path(args.child_dir)
        wall = train_config(configs(args.cpus)[args.child], args, run_dir)
        (run_dir / "wall_s").write_text(f"{wall}\n")
        return
    out = Path(tempfile.mkdtemp(prefix="rlzoo-async-real-"))
    wanted = [w.strip() for w in args.configs.split(",") if w.strip()]
    load = os.getloadavg()[0]
    rows = []
    cpu = CpuSampler()
    for name, extra in configs(args.cpus).items():
        if wanted and name not in wanted:
            continue
        rows.append(run_one(name, extra, args, out, cpu))
        print(
            f"{name}: {rows[-1]['samples_s']:.3f} samples/s, idle {100 * rows[-1]['idle']:.1f}%", flush=True
        )
    syncs = [r for r in rows if r["name"].startswith("sync")]
    base = max(syncs, key=lambda r: r["samples_s"]) if syncs else None  # sync at its fastest
    cpu.stop()
    print()
    print(
        f"recipe {args.recipe}, {args.prompts} prompts x n={args.n} per step, {args.steps} steps, "
        f"{args.cpus} cores (split configs: two processes, threads per config name); "
        f"ratios against {base['name'] if base else '-'} (the faster sync); "
        f"load average at start {load:.2f}, at end {os.getloadavg()[0]:.2f}"
    )
    print(
        "| config | samples/s | vs sync | response tokens/s | vs sync | trainer idle | cores busy | CPU s / sample "
        "| reward/sample (all) | (last half) | curve vs sync | mean length | staleness | partial | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        speed = f"{r['samples_s'] / base['samples_s']:.2f}x" if base else "-"
        tspeed = f"{r['tokens_s'] / base['tokens_s']:.2f}x" if base else "-"
        print(
            f"| {r['name']} | {r['samples_s']:.3f} | {speed} | {r['tokens_s']:.1f} | {tspeed} | "
            f"{100 * r['idle']:.1f}% | {r['busy_cores']:.2f} | "
            f"{r['cpu_s_per_sample']:.2f} | {r['reward']:.3f} | {r['reward_late']:.3f} | "
            f"{curve_gap(r, base)} | {r['len_mean']:.0f} | {r['stale_mean']:.2f} | {r['partial']:.2f} | "
            f"{r['wall']:.0f} |"
        )
    if base and base["busy_cores"] == base["busy_cores"]:
        print()
        print(
            f"ceiling of overlap: {base['name']} kept {base['busy_cores']:.2f} of {args.cpus} cores busy, so a "
            f"runner doing its work per sample ({base['cpu_s_per_sample']:.2f} CPU s) on every core could reach "
            f"{args.cpus / base['busy_cores']:.2f}x; more only by doing less work per sample"
        )
    print()
    print("reward per trained sample (samples consumed: mean reward of that step's batch)")
    for r in rows:
        print(f"  {r['name']}: " + ", ".join(f"{n}:{s:.3f}" for n, s in r["curve"]))
    print("mean response length of each step's batch")
    for r in rows:
        print(f"  {r['name']}: " + ", ".join(f"{x:.0f}" for x in r["lengths"]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
