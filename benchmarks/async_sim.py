"""Sync vs one-step-off vs fully-async on the simulated backends, same resources. Prints a table.

    python benchmarks/async_sim.py [--steps 12] [--devices 8] [--configs sync,fa_s0.1_k4]

The **real** runners, queue, Session and PolicyTrainer run; only the two backends are simulated
(:mod:`rlzoo.backends.simulated.backend`), with wall-clock costs:

- rollout: continuous batching over ``slots_per_device * devices`` slots; each decode step costs
  ``--decode-ms`` for the whole running batch; response lengths are log-normal (mean
  ``--mean-len``, shape ``--sigma``, capped at ``--max-len``): a long tail holds a synchronous
  batch until its longest response is done.
- train: log-probs and updates cost time proportional to tokens, divided by the pool's devices.

Resources are the same for every config: ``--devices`` in all. **sync** is colocated: rollout and
training alternate on all devices. The asynchronous runners split them half / half (e.g. 4 + 4),
as in the seed runs. The default costs balance the split: the rollout half produces tokens about
10% faster than the training half consumes them.

Columns: throughput in trained samples/s and tokens/s (steady state: after the first step),
trainer idle ratio (share of the trainer's wall-clock spent waiting for samples; for colocated
sync, the share spent generating), staleness (policy versions), dropped samples, partial ratio.
The quickstart task only provides prompts, a tokenizer and a scorer; nothing learns here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

STEP_PROMPTS = 32  # prompts per trainer step (R x M for the async runners)
N = 4  # responses per prompt


def configs(args: argparse.Namespace) -> dict[str, list[str]]:
    half = max(1, args.devices // 2)
    roll = (
        f"{{name:simulated,devices:{{d}},slots_per_device:{args.slots},decode_step_s:{args.decode_ms / 1000},"
        f"mean_response_length:{args.mean_len},sigma:{args.sigma}}}"
    )
    train = f"{{name:simulated,devices:{{d}},forward_s_per_token:{args.fwd_us * 1e-6},update_s_per_token:{args.upd_us * 1e-6}}}"

    def backends(d: int) -> list[str]:
        return [
            "~rollout.backend",
            "+rollout.backend=" + roll.replace("{d}", str(d)),
            "~trainer.backend",
            "+trainer.backend=" + train.replace("{d}", str(d)),
        ]

    def fa(s: float, k: int, r: int, partial: bool) -> list[str]:
        return [
            *backends(half),
            "~runner",
            f"+runner={{name:fully_async,staleness_threshold:{s},trigger_parameter_sync_step:{k},"
            f"require_batches:{r},partial_rollout:{str(partial).lower()}}}",
            f"trainer.ppo_mini_batch_size={STEP_PROMPTS // r}",
        ]

    return {
        f"sync (colocated, {args.devices} dev)": [*backends(args.devices), "runner=sync"],
        f"one_step_off ({half}+{half})": [*backends(half), "runner=one_step_off"],
        f"fully_async s=0 K=1 ({half}+{half})": fa(0.0, 1, 1, False),
        f"fully_async s=0.1 K=4 R=2 partial ({half}+{half})": fa(0.1, 4, 2, True),
        f"fully_async s=0.1 K=4 R=2 no-partial ({half}+{half})": fa(0.1, 4, 2, False),
        f"fully_async s=0.5 K=1 partial ({half}+{half})": fa(0.5, 1, 1, True),
        f"fully_async s=0.25 K=4 R=2 partial ({half}+{half})": fa(0.25, 4, 2, True),
        f"fully_async s=0.5 K=2 R=2 partial ({half}+{half})": fa(0.5, 2, 2, True),
        f"fully_async s=0.5 K=4 R=2 partial ({half}+{half})": fa(0.5, 4, 2, True),
    }


def plugin_manager() -> Any:
    from rlzoo.kernel.plugins import PluginManager

    return PluginManager(load_entrypoints=False)  # the simulated backends are built in


def run_one(
    name: str, extra: list[str], args: argparse.Namespace, pm: Any, data_dir: str, out: Path
) -> dict[str, Any]:
    import rlzoo
    from rlzoo.report.metrics import read_metrics

    run_dir = out / name.split(" ")[0].replace("=", "") / str(abs(hash(name)))
    common = [
        f"data.dir={data_dir}",
        f"run.output_dir={run_dir}",
        "run.progress=false",
        "run.loggers=[jsonl]",
        "trainer.val_before_train=false",
        "data.val_files=[]",
        "trainer.test_freq=1000000",
        "trainer.save_freq=1000000",
        f"trainer.total_steps={args.steps}",
        f"data.train_batch_size={STEP_PROMPTS}",
        "trainer.ppo_mini_batch_size=16",
        f"rollout.n={N}",
        f"data.max_response_length={args.max_len}",
    ]
    run = rlzoo.build_run("quickstart", [*common, *extra], pm=pm)
    t0 = time.perf_counter()
    run.train()
    wall = time.perf_counter() - t0
    recs = [r for r in read_metrics(run_dir) if r["step"] >= 1]
    steady = recs[1:]
    span = steady[-1]["time"] - recs[0]["time"]
    samples = sum(STEP_PROMPTS * N for _ in steady)
    tokens = sum(r["perf/total_num_tokens"] for r in steady)
    if "trainer/idle_ratio" in steady[0]:
        idle = statistics.mean(r["trainer/idle_ratio"] for r in steady)
    else:  # colocated sync: the training devices wait while generating (and scoring)
        idle = statistics.mean(
            (r.get("timing_s/gen", 0.0) + r.get("timing_s/reward", 0.0)) / r["timing_s/step"] for r in steady
        )
    return {
        "name": name,
        "samples_s": samples / span,
        "tokens_s": tokens / span,
        "idle": idle,
        "stale_mean": statistics.mean(r.get("staleness/mean", 0.0) for r in steady),
        "stale_max": max(r.get("staleness/max", 0.0) for r in steady),
        "dropped": steady[-1].get("rollouter/dropped_samples", 0.0),
        "partial": statistics.mean(r.get("rollout/partial_ratio", 0.0) for r in steady),
        "wall": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="trainer steps per config")
    ap.add_argument(
        "--devices", type=int, default=8, help="devices in all (async: half rollout, half training)"
    )
    ap.add_argument("--slots", type=int, default=16, help="decode slots per rollout device")
    ap.add_argument("--decode-ms", type=float, default=2.0, help="ms per decode step of the running batch")
    ap.add_argument("--mean-len", type=float, default=64.0, help="mean response length (log-normal)")
    ap.add_argument("--sigma", type=float, default=1.0, help="log-normal shape (tail)")
    ap.add_argument("--max-len", type=int, default=512, help="max_response_length")
    ap.add_argument("--fwd-us", type=float, default=35.0, help="train forward, us per token on one device")
    ap.add_argument(
        "--upd-us", type=float, default=103.0, help="train forward+backward, us per token on one device"
    )
    ap.add_argument("--configs", default="", help="comma-separated name prefixes to run (default: all)")
    args = ap.parse_args()

    import logging

    import torch

    torch.set_num_threads(1)  # the simulated costs are sleeps; keep torch's own threads out of the way
    logging.getLogger("rlzoo").setLevel(logging.WARNING)
    cache = os.environ.get("RLZOO_CACHE", os.path.join(tempfile.gettempdir(), "rlzoo-bench"))
    data_dir = os.path.join(cache, "quickstart")
    pm = plugin_manager()
    out = Path(tempfile.mkdtemp(prefix="rlzoo-async-sim-"))
    wanted = [w.strip() for w in args.configs.split(",") if w.strip()]
    rows = []
    for name, extra in configs(args).items():
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        rows.append(run_one(name, extra, args, pm, data_dir, out))
    base = next((r for r in rows if r["name"].startswith("sync")), None)
    print()
    print(
        f"simulated workload: {STEP_PROMPTS} prompts x n={N} per step, lengths log-normal mean {args.mean_len} "
        f"sigma {args.sigma} cap {args.max_len}, decode {args.decode_ms} ms/step x {args.slots} slots/device, "
        f"train {args.fwd_us}+{args.upd_us} us/token/device, {args.devices} devices, {args.steps} steps"
    )
    header = "| config | samples/s | tokens/s | vs sync | trainer idle | staleness mean / max | dropped | partial | wall s |"
    print(header)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        speed = f"{r['tokens_s'] / base['tokens_s']:.2f}x" if base else "-"
        print(
            f"| {r['name']} | {r['samples_s']:.0f} | {r['tokens_s']:.0f} | {speed} | {100 * r['idle']:.1f}% | "
            f"{r['stale_mean']:.2f} / {r['stale_max']:.0f} | {r['dropped']:.0f} | {r['partial']:.2f} | {r['wall']:.1f} |"
        )


if __name__ == "__main__":
    main()
