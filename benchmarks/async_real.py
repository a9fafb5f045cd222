"""Real overlap on a CPU: sync vs one-step-off vs fully-async with a real model, same cores. Prints a table.

    python benchmarks/async_real.py [--steps 8] [--recipe grpo_smollm2_count] [--configs sync,fa_partial]

Unlike ``benchmarks/async_sim.py`` nothing is simulated: the recipe's native engine generates and the
native trainer trains (SmolLM2-135M-Instruct on ``smollm2_count`` by default: answers from a few tokens
to 256, EOS honoured). Every config gets the same cores (``--cpus``, default all of this machine):

- **sync**: one process, rollout and training alternate, torch using every core (``sync``) or one
  thread (``sync_1thread``: on a loaded machine torch's threads contend, and one thread can be faster);
- **one_step_off** and **fully_async**: ``placement.name=ray, colocate=false``: the rollout engine and
  the trainer are two Ray worker processes with half the cores each (torch threads = their cores),
  weights pushed between them after each sync window, as on GPUs.

Columns: trained samples/s over the steady state (after the first step, whose time includes starting
the workers and the first full batch), its ratio to sync, the trainer's idle ratio measured the seed's
way (share of the trainer's wall-clock spent waiting on the queue; for sync, the share spent
generating and scoring), mean reward per trained sample (all steps, and the last half), staleness,
partial ratio. The reward curve per sample consumed is printed below the table for each config.
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


def configs() -> dict[str, list[str]]:
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

    return {
        "sync": ["runner=sync"],
        "sync_1thread": ["runner=sync", "+threads=1"],
        "one_step_off": [*split, "runner=one_step_off"],
        "fa_partial": fa(True),
        "fa_no_partial": fa(False),
    }


def steady_rate(recs: list[dict[str, Any]], per_step: int) -> float:
    """Trained samples per second after the first step (which pays for starting up)."""
    if len(recs) < 2:
        return float("nan")
    span = recs[-1]["time"] - recs[0]["time"]
    return per_step * (len(recs) - 1) / span if span > 0 else float("nan")


def idle_ratio(recs: list[dict[str, Any]]) -> float:
    steady = recs[1:] or recs
    if "trainer/idle_ratio" in steady[0]:
        return statistics.mean(r["trainer/idle_ratio"] for r in steady)
    # sync: the trainer's share of the step spent waiting for generation and scoring
    return statistics.mean(
        (r.get("timing_s/gen", 0.0) + r.get("timing_s/reward", 0.0)) / r["timing_s/step"] for r in steady
    )


def run_one(name: str, extra: list[str], args: argparse.Namespace, out: Path) -> dict[str, Any]:
    import rlzoo
    from rlzoo.report.metrics import read_metrics

    split = "placement.name=ray" in extra
    threads = next((int(e.split("=")[1]) for e in extra if e.startswith("+threads=")), args.cpus)
    extra = [e for e in extra if not e.startswith("+threads=")]
    run_dir = out / name
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
    recs = [r for r in read_metrics(run_dir) if r["step"] >= 1]
    per_step = args.prompts * args.n
    scores = [r["critic/score/mean"] for r in recs]
    half = scores[len(scores) // 2 :]
    return {
        "name": name,
        "samples_s": steady_rate(recs, per_step),
        "idle": idle_ratio(recs),
        "reward": statistics.mean(scores),
        "reward_late": statistics.mean(half),
        "curve": [(per_step * (i + 1), s) for i, s in enumerate(scores)],
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
    args = ap.parse_args()

    import logging

    logging.getLogger("rlzoo").setLevel(logging.WARNING)
    out = Path(tempfile.mkdtemp(prefix="rlzoo-async-real-"))
    wanted = [w.strip() for w in args.configs.split(",") if w.strip()]
    load = os.getloadavg()[0]
    rows = []
    for name, extra in configs().items():
        if wanted and name not in wanted:
            continue
        rows.append(run_one(name, extra, args, out))
        print(
            f"{name}: {rows[-1]['samples_s']:.3f} samples/s, idle {100 * rows[-1]['idle']:.1f}%", flush=True
        )
    syncs = [r for r in rows if r["name"].startswith("sync")]
    base = max(syncs, key=lambda r: r["samples_s"]) if syncs else None  # sync at its fastest
    print()
    print(
        f"recipe {args.recipe}, {args.prompts} prompts x n={args.n} per step, {args.steps} steps, "
        f"{args.cpus} cores (async: {max(1, args.cpus // 2)} + {max(1, args.cpus // 2)}); "
        f"ratios against {base['name'] if base else '-'} (the faster sync); "
        f"load average at start {load:.2f}, at end {os.getloadavg()[0]:.2f}"
    )
    print(
        "| config | samples/s | vs sync | trainer idle | reward/sample (all) | (last half) "
        "| mean length | staleness | partial | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        speed = f"{r['samples_s'] / base['samples_s']:.2f}x" if base else "-"
        print(
            f"| {r['name']} | {r['samples_s']:.3f} | {speed} | {100 * r['idle']:.1f}% | {r['reward']:.3f} | "
            f"{r['reward_late']:.3f} | {r['len_mean']:.0f} | {r['stale_mean']:.2f} | {r['partial']:.2f} | "
            f"{r['wall']:.0f} |"
        )
    print()
    print("reward per trained sample (samples consumed: mean reward of that step's batch)")
    for r in rows:
        print(f"  {r['name']}: " + ", ".join(f"{n}:{s:.3f}" for n, s in r["curve"]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
