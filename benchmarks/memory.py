"""Memory and speed of a policy update at long responses: chunked log-probs (after) vs unchunked (before).

Each configuration runs in a fresh subprocess (so one peak does not hide another): it builds the
native train backend, then runs policy updates over one mini-batch of ``rows`` samples (64-token
prompts + ``T``-token responses, all tokens real) with a token-mean policy-gradient loss plus an
entropy bonus (so the entropy's backward is exercised too). Printed per configuration:

- ``step peak``: the process's resident-memory high-water mark during the update minus the
  resident memory just before it (``/proc/self/clear_refs`` resets the mark), i.e. what the
  log-prob / entropy step costs on top of the model and optimizer state;
- ``peak RSS``: the subprocess's whole-life peak (``wait4``'s ``ru_maxrss``);
- ``s/step``: wall seconds of the last update (after one warm-up update on the small models).

``before`` is ``trainer.micro_batch.log_prob_chunk: 0`` (logits, then the unchunked fp32
computation, as rlzoo did before chunking), ``after`` the defaults (chunks of 256 positions, the
LM head inside the chunks: ``trainer.backend.fused_lm_head``). Models: ``tiny151k``, a 2-layer
Qwen2 of width 64 built from a config with Qwen's 151,936-token vocabulary (the logits dominate
everything), and SmolLM2-135M-Instruct (49,152 tokens; ``rlzoo prepare smollm2_arith`` puts it
under ``$RLZOO_CACHE/smollm2_arith/model``; skipped with a note when absent).

    python benchmarks/memory.py                   # the table (a few minutes on 2 cores)
    python benchmarks/memory.py --quick           # tiny151k only
    python benchmarks/memory.py --models smollm2 --lengths 2048 --dtypes bfloat16
    python benchmarks/memory.py --models smollm2 --checkpointing   # gradient checkpointing off → on

Response lengths: tiny151k 512 (4 rows) and 2048 (1 row); SmolLM2 128 (16 rows: the recipe's
micro-batch, the length at which a GRPO step used to be killed at 24 GB) and 2048 (1 row).

Run it alone on the machine (peak memory of the unchunked 151k-vocabulary configurations is
several GB): ``flock /tmp/rlzoo-heavy.lock python benchmarks/memory.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlzoo.kernel.settings import MicroBatchSettings

PROMPT = 64
ROWS = {128: 16, 512: 4, 2048: 1}  # 128: the SmolLM2 recipe's micro-batch of 16; else ~2k response tokens
LENGTHS = {"tiny151k": [512, 2048], "smollm2": [128, 2048]}


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def worker(cfg: dict[str, Any]) -> dict[str, Any]:
    """One configuration, in this (fresh) process; returns the measurements."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlzoo.backends.native.train import NativeTrainBackend
    from rlzoo.backends.native.train_params import NativeTrainParams
    from rlzoo.kernel.batch import Batch
    from rlzoo.kernel.settings import MicroBatchSettings, TrainSpec
    from rlzoo.models.tiny import tiny_qwen2_config

    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg["dtype"]]
    if cfg["model"] == "tiny151k":
        model = AutoModelForCausalLM.from_config(
            tiny_qwen2_config(151_936, hidden_size=64, num_layers=2, tie_word_embeddings=True)
        )
        vocab = 151_936
    else:
        model = AutoModelForCausalLM.from_pretrained(cfg["path"], dtype=torch.float32)
        vocab = int(model.config.vocab_size)
    T, rows = cfg["T"], cfg["rows"]
    spec = TrainSpec(
        model_path="",
        micro_batch=MicroBatchSettings(size=rows, log_prob_size=rows, log_prob_chunk=cfg["chunk"]),
    )
    params = NativeTrainParams(
        device="cpu", dtype=cfg["dtype"], gradient_checkpointing=cfg.get("checkpointing", False)
    )
    backend = NativeTrainBackend.from_module(model, params, spec)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (rows, PROMPT + T), generator=g)
    attn = torch.ones_like(ids)
    batch = Batch(
        {
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1),
            "responses": ids[:, PROMPT:],
            "response_mask": attn[:, PROMPT:].float(),
            "advantages": torch.randn(rows, T, generator=g),
        }
    )

    def objective(
        mb: Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict]:
        mask = mb["response_mask"]
        assert entropy is not None
        loss = -((log_probs * mb["advantages"] - 0.01 * entropy) * mask).sum() / mask.sum()
        return loss, {}

    objective.needs_entropy = True  # type: ignore[attr-defined]
    del dtype
    steps = 2 if cfg["model"] == "tiny151k" else 1
    rss0 = _status_kb("VmRSS")
    _reset_peak()
    secs = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        backend.update_policy(batch, objective)
        secs = time.perf_counter() - t0
    return {"step_peak_mb": (_status_kb("VmHWM") - rss0) / 1024, "s_per_step": secs}


def run_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """``worker(cfg)`` in a subprocess; adds its whole-life peak RSS (or the reason it failed)."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker", json.dumps(cfg)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    res: dict[str, Any] = {"peak_rss_mb": usage.ru_maxrss / 1024}
    if proc.returncode != 0:
        res["error"] = f"exit {proc.returncode}" + (
            " (killed: out of memory?)" if proc.returncode < 0 else ""
        )
        return res
    res.update(json.loads(out.strip().splitlines()[-1]))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--models", nargs="+", default=["tiny151k", "smollm2"], choices=["tiny151k", "smollm2"])
    ap.add_argument("--lengths", nargs="+", type=int, help=f"response tokens T (default: {LENGTHS})")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument(
        "--chunk",
        type=int,
        default=MicroBatchSettings().log_prob_chunk,
        help="the 'after' trainer.micro_batch.log_prob_chunk (default: its default)",
    )
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="torch threads")
    ap.add_argument("--rows", type=int, help="samples per micro-batch (default: by length, see above)")
    ap.add_argument("--quick", action="store_true", help="tiny151k only")
    ap.add_argument(
        "--checkpointing",
        action="store_true",
        help="compare gradient checkpointing instead: before = off, after = on (both chunked)",
    )
    ns = ap.parse_args()
    if ns.worker:
        print(json.dumps(worker(json.loads(ns.worker))))
        return
    cache = Path(os.environ.get("RLZOO_CACHE", "~/.cache/rlzoo")).expanduser()
    smol = cache / "smollm2_arith" / "model"
    models = ["tiny151k"] if ns.quick else ns.models
    if "smollm2" in models and not (smol / "config.json").exists():
        print(f"(smollm2 skipped: no model at {smol}; run `rlzoo prepare smollm2_arith --out {smol.parent}`)")
        models = [m for m in models if m != "smollm2"]
    load = os.getloadavg()
    what = (
        f"before = gradient checkpointing off, after = on (log_prob_chunk {ns.chunk})"
        if ns.checkpointing
        else f"before = log_prob_chunk 0, after = {ns.chunk}"
    )
    print(
        f"native train backend, CPU, torch threads {ns.threads}, load average {load[0]:.1f} at start; "
        f"prompt {PROMPT} tokens; one micro-batch per update; {what}"
    )
    head = (
        f"{'model':<9} {'dtype':<8} {'T':>5} {'rows':>4} | {'step peak MB':>21} {'ratio':>6} | "
        f"{'peak RSS MB':>17} | {'s/step':>13} {'ratio':>6}"
    )
    print(head)
    print(f"{'':<30} | {'before → after':>21} {'':>6} | {'before → after':>17} | {'before → after':>13}")
    print("-" * len(head))
    for model in models:
        for T in ns.lengths or LENGTHS[model]:
            for dtype in ns.dtypes:
                rows = ns.rows or ROWS.get(T, max(1, 2048 // T))
                base = {"model": model, "path": str(smol), "T": T, "rows": rows, "dtype": dtype}
                base["threads"] = ns.threads
                if ns.checkpointing:
                    before = run_config({**base, "chunk": ns.chunk})
                    after = run_config({**base, "chunk": ns.chunk, "checkpointing": True})
                else:
                    before = run_config({**base, "chunk": 0})
                    after = run_config({**base, "chunk": ns.chunk})
                print(_row(model, dtype, T, rows, before, after), flush=True)


def _row(model: str, dtype: str, T: int, rows: int, before: dict, after: dict) -> str:
    def num(r: dict, k: str, fmt: str) -> str:
        return r["error"] if "error" in r and k != "peak_rss_mb" else format(r[k], fmt)

    def ratio(k: str) -> str:
        if "error" in before or "error" in after or not before[k]:
            return "-"
        return f"{after[k] / before[k]:.2f}"

    return (
        f"{model:<9} {dtype:<8} {T:>5} {rows:>4} | "
        f"{num(before, 'step_peak_mb', '.0f'):>9} → {num(after, 'step_peak_mb', '.0f'):>9} {ratio('step_peak_mb'):>6} | "
        f"{num(before, 'peak_rss_mb', '.0f'):>7} → {num(after, 'peak_rss_mb', '.0f'):>7} | "
        f"{num(before, 's_per_step', '.2f'):>5} → {num(after, 's_per_step', '.2f'):>5} {ratio('s_per_step'):>6}"
    )


if __name__ == "__main__":
    main()
