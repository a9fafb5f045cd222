"""LoRA vs full fine-tuning on SmolLM2-135M on a CPU, side by side with TRL's GRPOTrainer + peft.

Each row is one training run in its own process (so the peak RSS is that run's alone), on the
``grpo_smollm2_arith`` recipe with the settings of ``benchmarks/vs_trl.py`` (8 prompts x 8
samples, <= 16 new tokens, one optimizer step per batch, clip 0.2 / 0.28, token-mean, the same
precision and torch threads on both sides) plus a KL term to the reference policy (``--kl``,
default 0.001: rlzoo ``use_kl_loss`` with ``low_var_kl``, TRL ``beta``), so each side holds its
reference: full fine-tuning a second copy of the weights, LoRA the same model with its adapters off
(both rlzoo and TRL+peft). LoRA on both sides: rank ``--rank`` (16), alpha 2 x rank, no dropout,
every linear layer but the LM head (peft's ``all-linear``).

Columns: median seconds per full step cycle (2 warm-up cycles and rlzoo's last, which writes the
final export, not counted), peak RSS of the run's process, trainable parameters, and bytes per
weight push (rlzoo: ``perf/weight_push_bytes``, what the trainer sends its rollout engine; TRL
without vLLM generates with the training model itself and pushes nothing, with vLLM it merges the
adapter and sends the full model, the "merged" size printed below the table).

    pip install -c constraints.txt trl peft       # benchmark-only dependency (trl)
    python benchmarks/lora.py                     # rlzoo full, rlzoo LoRA, TRL LoRA: ~5 minutes on 2 cores
    python benchmarks/lora.py --rows rlzoo-lora trl-lora --steps 6 --precision bf16
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import vs_trl

ROWS = ("rlzoo-full", "rlzoo-lora", "trl-lora", "trl-full")


def child(row: str, ns: argparse.Namespace) -> dict[str, Any]:
    """One benchmark row in this process; returns its numbers."""
    if ns.threads:
        torch.set_num_threads(ns.threads)
    s = vs_trl.settings(ns.model)
    lora = row.endswith("lora")
    out: dict[str, Any] = {"row": row}
    if row.startswith("rlzoo"):
        extra = ["algorithm.use_kl_loss=true", f"algorithm.kl_loss_coef={ns.kl}"] if ns.kl > 0 else []
        if lora:
            extra += [
                f"trainer.lora.rank={ns.rank}",
                f"trainer.lora.alpha={2 * ns.rank}",
                "trainer.lora.dropout=0",
            ]
        records: list[dict[str, Any]] = []
        sec, toks, phases = vs_trl.run_rlzoo(s, ns.precision, ns.steps, tuple(extra), records=records)
        pushes = [r["perf/weight_push_bytes"] for r in records if "perf/weight_push_bytes" in r]
        out.update(
            sec=sec, tok_s=toks, push_bytes=statistics.median(pushes) if pushes else None, phases=phases
        )
    else:
        from peft import LoraConfig

        cfg = (
            LoraConfig(
                r=ns.rank,
                lora_alpha=2 * ns.rank,
                lora_dropout=0.0,
                target_modules="all-linear",
                task_type="CAUSAL_LM",
            )
            if lora
            else None
        )
        sec, toks = vs_trl.run_trl(s, ns.precision, ns.steps, peft_config=cfg, beta=ns.kl)
        out.update(sec=sec, tok_s=toks, push_bytes=None)
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    out["trainable"] = trainable_params(s["dir"] / "model", ns.rank if lora else None)
    return out


def trainable_params(model_dir: Path, rank: int | None) -> int:
    """Parameters trained: the whole model, or peft's count for the ``all-linear`` adapter of ``rank``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    if rank is None:
        return sum(p.numel() for p in model.parameters())
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=rank, target_modules="all-linear"))
    return sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS[:3]))
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2", help="tiny: a smoke test")
    ap.add_argument("--steps", type=int, default=5, help="batches per row (2 warm-up cycles are not counted)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--kl", type=float, default=0.001, help="KL coefficient (0: no reference policy)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--threads", type=int, default=None, help="torch threads, both sides")
    ap.add_argument("--child", choices=ROWS, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        print("RESULT " + json.dumps(child(ns.child, ns)), flush=True)
        return
    s = vs_trl.settings(ns.model)
    if not (s["dir"] / "train.parquet").exists():
        import rlzoo

        comp = rlzoo.get_plugin_manager().get(
            "dataset", "smollm2_arith" if ns.model == "smollm2" else "quickstart"
        )
        comp.load()(s["dir"], comp.default_params())
    results = []
    for row in ns.rows:
        args = [sys.executable, __file__, "--child", row, "--steps", str(ns.steps), "--rank", str(ns.rank)]
        args += ["--kl", str(ns.kl), "--precision", ns.precision, "--model", ns.model]
        if ns.threads:
            args += ["--threads", str(ns.threads)]
        proc = subprocess.run(args, capture_output=True, text=True, env=os.environ.copy())
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            print(f"{row} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
            continue
        results.append(json.loads(line[-1][len("RESULT ") :]))
        print_table(results, ns, s["dir"] / "model")


def print_table(results: list[dict[str, Any]], ns: argparse.Namespace, model_dir: Path) -> None:
    print(
        f"\n{ns.model}, {vs_trl.PROMPTS} prompts x {vs_trl.N} samples, {ns.precision}, KL {ns.kl}, "
        f"LoRA r={ns.rank} all-linear; median step cycle over {ns.steps} batches, load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'row':<11} {'s/batch':>8} {'tok/s':>7} {'peak RSS':>9} {'trainable':>11} {'bytes/push':>12}")
    for r in results:
        push = f"{r['push_bytes'] / 1e6:.2f} MB" if r["push_bytes"] else "-"
        print(
            f"{r['row']:<11} {r['sec']:>8.2f} {r['tok_s']:>7.0f} {r['peak_rss'] / 2**30:>7.2f} G "
            f"{r['trainable'] / 1e6:>9.2f} M {push:>12}"
        )
    by = {r["row"]: r for r in results}
    if "rlzoo-lora" in by and "rlzoo-full" in by:
        f, lo = by["rlzoo-full"], by["rlzoo-lora"]
        print(
            f"rlzoo LoRA vs full: {f['sec'] / lo['sec']:.2f}x s/batch, "
            f"peak RSS {(lo['peak_rss'] - f['peak_rss']) / 2**20:+.0f} MB, "
            f"{f['push_bytes'] / lo['push_bytes']:.0f}x fewer bytes per push"
        )
    if "rlzoo-lora" in by and "trl-lora" in by:
        print(f"rlzoo LoRA vs TRL LoRA: {by['trl-lora']['sec'] / by['rlzoo-lora']['sec']:.2f}x per batch")
    merged = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    print(f"merged model (what TRL+vLLM sends per push, fp32 safetensors): {merged / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
