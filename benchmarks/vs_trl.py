"""rlzoo vs TRL's GRPOTrainer on the same work, each side in its fastest configuration, on a CPU.

The work: the same model on the same prompts (the recipe's train parquet), 8 prompts x 8 samples per
batch, the same response limit, one optimizer step per batch (so both skip the old-log-prob forward:
TRL when its steps align, rlzoo when the update is exactly on-policy), PPO clip 0.2 / 0.28,
token-mean over the batch (TRL's ``dapo`` loss), group std normalisation, no KL, no entropy bonus,
the same LR, temperature 1.0, the same torch threads (``--threads``, both sides). TRL generates anew
for every optimizer step (``num_iterations=1``), as rlzoo does.

What each side may choose (a *configuration*, ``side:precision:micro[:packed][:omp=POLICY]``):

- precision ``fp32``, or ``bf16``: TRL's ``bf16=True`` (autocast over fp32 weights; generation
  under it too); rlzoo decodes with bf16 weights and trains with bf16 autocast over fp32 weights.
- micro: samples per forward/backward. TRL: ``per_device_train_batch_size`` with gradient
  accumulation up to the 64 samples of the batch (64: no accumulation). rlzoo:
  ``trainer.micro_batch.size`` (gradients accumulate within the one optimizer step either way).
- ``auto`` (rlzoo, precision and / or micro): rlzoo's defaults -- the recipe's ``model.dtype: auto`` /
  ``trainer.backend.autocast: auto`` (bf16 where the CPU has avx512_bf16 / AMX) and micro-batch
  sizes chosen from the machine's memory (:mod:`rlzoo.train_kit.fastest`; the run prints its choice).
- ``packed`` (rlzoo): ``trainer.backend.use_remove_padding=true`` (padding-free micro-batches).
- ``omp=<policy>``: how the child's OpenMP threads wait (:data:`rlzoo.system.threads.WAIT_POLICIES`:
  ``keep`` = libgomp's own 300,000-spin waiting, ``short``, ``passive``). Default: each side's own
  -- rlzoo's :data:`~rlzoo.system.threads.DEFAULT_WAIT_POLICY` (set in the child's environment before it imports torch), TRL's
  ``keep`` (what a TRL program gets); ``trl:bf16:64:omp=short`` gives TRL rlzoo's setting.

Every configuration runs in a fresh subprocess, so each one's peak RSS (``wait4``'s ``ru_maxrss``,
the whole process: model load, generation, update) is its own. s/batch: the median over the
``--steps`` batches after the first (warm-up; ``--steps 1`` measures the one batch) of a full step
cycle, from one batch's end to the next's: rlzoo's metrics rows (generation, reward, advantages,
update, weight push, logging; the last batch, whose row follows the end-of-run HF export, by its
``timing_s/step``), TRL's optimizer steps (generation, reward, forward/backward, optimizer step,
logging). Mean completion length: rlzoo's ``response_length/mean``, TRL's
``completions/mean_length``.

``--ignore-eos`` makes every response run to ``--max-new`` tokens on both sides, the same way: both
load a copy of the model whose tokenizer / generation config declare ``<empty_output>`` (a special
token arithmetic chats do not produce) as the end-of-sequence token, so a sampled ``<|im_end|>``
does not stop a sequence and is not masked out (TRL's completion mask cuts at its EOS, rlzoo's
engine stops at it). Weights, prompts and chat template are unchanged. Without it responses end
where the model ends them (SmolLM2 writes ~40 tokens for these prompts).

    pip install -c constraints.txt -e .[bench-trl]     # TRL: benchmark-only dependency
    python benchmarks/vs_trl.py --model tiny           # the quickstart model (2 response tokens)
    python benchmarks/vs_trl.py --model smollm2        # SmolLM2-135M-Instruct, <= 16 new tokens
    python benchmarks/vs_trl.py --model smollm2 --max-new 256 --ignore-eos --steps 2 \\
        --configs rlzoo:bf16:16 trl:bf16:16
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import rlzoo
from rlzoo.report.metrics import read_metrics
from rlzoo.system.threads import DEFAULT_WAIT_POLICY, WAIT_POLICIES

PROMPTS, N, MICRO, LR = 8, 8, 16, 1e-5
# the configurations run by default: each side's candidates for its fastest (docs/performance.md), and
# rlzoo's defaults (``rlzoo:auto:auto``);
# TRL with libgomp's waiting (what a TRL program gets) and with rlzoo's short spin
DEFAULT_CONFIGS = (
    "rlzoo:auto:auto",  # rlzoo's defaults: micro-batch chosen from memory, bf16 where the CPU has it
    "rlzoo:bf16:64",
    "rlzoo:bf16:16",
    "rlzoo:fp32:16",
    "rlzoo:bf16:16:packed",
    "trl:bf16:64:omp=short",
    "trl:bf16:64",
    "trl:fp32:64:omp=short",
    "trl:bf16:16:omp=short",
)
NO_EOS_TOKEN = "<empty_output>"  # SmolLM2's id 16: the stand-in EOS of --ignore-eos


def settings(model: str, max_new: int | None = None) -> dict[str, Any]:
    cache = Path(os.environ.get("RLZOO_CACHE", "~/.cache/rlzoo")).expanduser()
    tiny = model == "tiny"  # else SmolLM2-135M-Instruct
    d = cache / ("quickstart" if tiny else "smollm2_arith")
    s = {
        "recipe": "quickstart" if tiny else "grpo_smollm2_arith",
        "dir": d,
        "max_new": 2 if tiny else 16,
        "max_prompt": 16 if tiny else 64,
        "lr": 3e-3 if tiny else LR,
        "model": d / "model",
    }
    if max_new is not None:
        s["max_new"] = max_new
    return s


def no_eos_model(model: Path) -> Path:
    """A copy of ``model`` (weights linked, not copied) whose tokenizer, generation config and
    config declare :data:`NO_EOS_TOKEN` the end-of-sequence token (pad token unchanged)."""
    out = model.parent / "model_no_eos"
    if (out / "config.json").exists():
        return out
    out.mkdir(exist_ok=True)
    for f in model.iterdir():
        keep = f.name not in ("tokenizer_config.json", "generation_config.json", "config.json")
        if keep and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    eos_id = tok.convert_tokens_to_ids(NO_EOS_TOKEN)
    if eos_id is None or eos_id == tok.unk_token_id:
        raise SystemExit(f"--ignore-eos: the tokenizer of {model} has no {NO_EOS_TOKEN} token")
    tc = json.loads((model / "tokenizer_config.json").read_text())
    tc["eos_token"] = NO_EOS_TOKEN
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    for name in ("generation_config.json", "config.json"):
        c = json.loads((model / name).read_text())
        c["eos_token_id"] = eos_id
        (out / name).write_text(json.dumps(c, indent=2))
    return out


def rlzoo_overrides(
    s: dict[str, Any], precision: str, steps: int, out: str, *, micro: int = MICRO, packed: bool = False
) -> list[str]:
    o = [
        f"data.dir={s['dir']}",
        f"model.path={s['model']}",
        f"run.output_dir={out}",
        "run.progress=false",
        "run.loggers=[jsonl]",
        f"data.train_batch_size={PROMPTS}",
        f"data.max_response_length={s['max_new']}",
        f"rollout.n={N}",
        "rollout.temperature=1.0",
        f"trainer.ppo_mini_batch_size={PROMPTS}",
        "trainer.ppo_epochs=1",
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
    if micro:  # 0: rlzoo's default, chosen from the machine's memory (printed by the run)
        o += [f"trainer.micro_batch.size={micro}", f"trainer.micro_batch.log_prob_size={micro}"]
    if precision == "bf16":
        o += ["model.dtype=bfloat16", "trainer.backend.autocast=bfloat16"]
    elif precision == "fp32":
        o += ["model.dtype=float32", "trainer.backend.autocast=null"]
    # "auto": the recipe's defaults (bf16 where the CPU has it)
    if packed:
        o += ["trainer.backend.use_remove_padding=true"]
    return o


def measure_rlzoo(
    s: dict[str, Any],
    precision: str,
    steps: int,
    extra: tuple[str, ...] = (),
    records: list | None = None,
    *,
    micro: int = MICRO,
    packed: bool = False,
) -> dict[str, Any]:
    """One rlzoo run: s/batch, tokens/s, mean completion length and phase seconds (medians over the
    batches after the first)."""
    with tempfile.TemporaryDirectory() as tmp:
        o = rlzoo_overrides(s, precision, steps, f"{tmp}/run", micro=micro, packed=packed)
        run = rlzoo.build_run(s["recipe"], [*o, *extra])
        run.train()
        assert run.run_dir is not None
        recs = [r for r in read_metrics(run.run_dir) if r["step"] > 0 and "timing_s/step" in r]
        if records is not None:
            records.extend(recs)
    timed = recs[1:] or recs  # batch 1: warm-up
    # full cycles (metrics row to metrics row, as TRL's) of batches 2 .. n-1: the last one's row
    # comes after the end-of-run HF export; with fewer batches, the batch's own timing_s/step
    cycles = [b["time"] - a["time"] for a, b in itertools.pairwise(recs)][:-1]
    sec = statistics.median(cycles) if cycles else statistics.median(r["timing_s/step"] for r in timed)
    resp = statistics.median(r["response_length/mean"] for r in timed)
    toks = statistics.median(
        (r["prompt_length/mean"] + r["response_length/mean"]) * PROMPTS * N for r in timed
    )
    phases = {
        k.split("/", 1)[1]: statistics.median(r.get(k, 0.0) for r in timed)
        for k in ("timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/update_actor")
    }
    return {"sec": sec, "tok_s": toks / sec, "completion": resp, "phases": phases}


def run_rlzoo(
    s: dict[str, Any], precision: str, steps: int, extra: tuple[str, ...] = (), records: list | None = None
) -> tuple[float, float, dict[str, float]]:
    """``extra``: more recipe overrides (benchmarks/lora.py: trainer.lora, the KL term); ``records``:
    a list that receives the run's metrics rows."""
    m = measure_rlzoo(s, precision, steps, extra, records)
    return m["sec"], m["tok_s"], m["phases"]


def measure_trl(
    s: dict[str, Any],
    precision: str,
    steps: int,
    *,
    micro: int = MICRO,
    peft_config: Any = None,
    beta: float = 0.0,
) -> dict[str, Any]:
    """One TRL run; ``peft_config``: a ``peft.LoraConfig`` (TRL trains that adapter); ``beta``: its
    KL coefficient."""
    import datasets
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlzoo.data.tokenizer import load_tokenizer
    from rlzoo.recipe.config import load_config

    scorer = load_config(s["recipe"]).reward.scorer  # the recipe's, as rlzoo's side scores
    ds = datasets.load_dataset("parquet", data_files=str(s["dir"] / "train.parquet"), split="train")
    ds = ds.map(lambda r: {"ground_truth": r["reward_model"]["ground_truth"]})
    ds = ds.select_columns(["prompt", "ground_truth"])

    def reward(prompts: list, completions: list, ground_truth: list, **_: Any) -> list[float | None]:
        out: list[float | None] = []
        for c, gt in zip(completions, ground_truth):
            text = c[0]["content"] if isinstance(c, list) else c
            r = scorer(text, gt, "", {})
            out.append(float(r["score"] if isinstance(r, dict) else r))
        return out

    class Clock(TrainerCallback):
        """Step cycles: from one optimizer step's end to the next's (the batch fetch, generation,
        reward, accumulation steps, optimizer step, and the previous step's logging)."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.tokens: list[float] = []
            self.lengths: list[float] = []
            self._t: float | None = None
            self._seen = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._t, self._seen = time.perf_counter(), state.num_input_tokens_seen

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.perf_counter()
            if self._t is not None:
                self.times.append(now - self._t)
                self.tokens.append(state.num_input_tokens_seen - self._seen)
            self._t, self._seen = now, state.num_input_tokens_seen

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    tok = load_tokenizer(str(s["model"]))
    model = AutoModelForCausalLM.from_pretrained(str(s["model"]), dtype="float32")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = GRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            bf16=precision == "bf16",
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=PROMPTS * N // micro,  # one optimizer step per batch
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
    times, tokens = clock.times[1:] or clock.times, clock.tokens[1:] or clock.tokens  # batch 1: warm-up
    sec = statistics.median(times)
    lengths = clock.lengths[1:] or clock.lengths
    return {
        "sec": sec,
        "tok_s": statistics.median(tokens) / sec,
        "completion": statistics.median(lengths) if lengths else float("nan"),
        "phases": {},
    }


def run_trl(
    s: dict[str, Any], precision: str, steps: int, *, peft_config: Any = None, beta: float = 0.0
) -> tuple[float, float]:
    m = measure_trl(s, precision, steps, peft_config=peft_config, beta=beta)
    return m["sec"], m["tok_s"]


def parse_config(spec: str) -> dict[str, Any]:
    parts = spec.split(":")
    tags = parts[3:]
    omp = [t.removeprefix("omp=") for t in tags if t.startswith("omp=")]
    auto = parts[0] == "rlzoo" and len(parts) >= 3 and "auto" in parts[1:3]
    ok = len(parts) >= 3 and parts[0] in ("rlzoo", "trl") and parts[1] in ("fp32", "bf16", "auto")
    ok = ok and (parts[1] != "auto" or parts[0] == "rlzoo")
    ok = ok and (
        (parts[2] == "auto" and auto) or (parts[2].isdigit() and (PROMPTS * N) % max(int(parts[2]), 1) == 0)
    )
    ok = ok and all(t.startswith("omp=") or (t == "packed" and parts[0] == "rlzoo") for t in tags)
    ok = ok and len(set(tags)) == len(tags) and len(omp) <= 1 and all(p in WAIT_POLICIES for p in omp)
    if not ok:
        raise SystemExit(
            f"configuration {spec!r}: expected side:precision:micro[:packed][:omp=POLICY] with side rlzoo|trl, "
            f"precision fp32|bf16 (rlzoo also auto: its default), micro a divisor of {PROMPTS * N} (rlzoo also "
            f"auto: chosen from memory), 'packed' for rlzoo only, POLICY one of "
            f"{', '.join(WAIT_POLICIES)} (e.g. rlzoo:auto:auto, rlzoo:bf16:16:packed, trl:bf16:64:omp=short)"
        )
    default_omp = DEFAULT_WAIT_POLICY if parts[0] == "rlzoo" else "keep"
    return {
        "side": parts[0],
        "precision": parts[1],
        "micro": 0 if parts[2] == "auto" else int(parts[2]),
        "packed": "packed" in tags,
        "omp": omp[0] if omp else default_omp,
    }


def child(cfg: dict[str, Any]) -> None:
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    s = settings(cfg["model"], cfg["max_new"])
    if cfg["ignore_eos"]:
        s["model"] = no_eos_model(s["model"])
    if cfg["side"] == "rlzoo":
        m = measure_rlzoo(s, cfg["precision"], cfg["steps"], micro=cfg["micro"], packed=cfg["packed"])
    else:
        m = measure_trl(s, cfg["precision"], cfg["steps"], micro=cfg["micro"])
    m["threads"] = torch.get_num_threads()
    print(json.dumps(m))


def run_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """:func:`child` in a fresh subprocess; adds its whole-life peak RSS and the load average."""
    load = os.getloadavg()[0]
    # the configuration's OpenMP waiting, set before the child imports torch
    drop = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "RLZOO_OMP_WAIT_POLICY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(WAIT_POLICIES[cfg["omp"]], RLZOO_OMP_WAIT_POLICY=cfg["omp"])
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(cfg)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    res: dict[str, Any] = {**cfg, "peak_rss_mb": usage.ru_maxrss / 1024, "load": load}
    if code != 0:
        res["error"] = f"exit {code}" + (" (killed: out of memory?)" if code < 0 else "")
        return res
    res.update(json.loads(out.strip().splitlines()[-1]))
    # what rlzoo chose for itself (micro-batch sizes, precision), as the run printed it
    res["chosen"] = [
        ln for ln in out.splitlines() if (ln.startswith("rlzoo: ") and "auto" in ln) or "micro_batch:" in ln
    ]
    return res


def name(r: dict[str, Any]) -> str:
    micro = r["micro"] or "auto"
    return f"{r['side']}:{r['precision']}:{micro}" + (":packed" if r["packed"] else "") + f":omp={r['omp']}"


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    print(f"\n{title}")
    print(
        f"{'configuration':<31} {'s/batch':>8} {'tok/s':>7} {'completion':>10} {'peak RSS MB':>11} "
        f"{'load':>5}  rlzoo phases (s)"
    )
    for r in rows:
        if "error" in r:
            print(f"{name(r):<31} {r['error']:>8}  peak RSS {r['peak_rss_mb']:.0f} MB")
            continue
        ph = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items() if v)
        print(
            f"{name(r):<31} {r['sec']:>8.2f} {r['tok_s']:>7.0f} {r['completion']:>10.1f} "
            f"{r['peak_rss_mb']:>11.0f} {r['load']:>5.1f}  {ph}"
        )
    for r in rows:
        for line in r.get("chosen", []):
            print(f"  {name(r)}: {line}")
    best = {}
    for side in ("rlzoo", "trl"):
        ok = [r for r in rows if r["side"] == side and "error" not in r]
        if ok:
            best[side] = min(ok, key=lambda r: r["sec"])
    if len(best) == 2:
        b_r, b_t = best["rlzoo"], best["trl"]
        print(
            f"fastest rlzoo {name(b_r)} {b_r['sec']:.1f} s, peak {b_r['peak_rss_mb']:.0f} MB; fastest TRL "
            f"{name(b_t)} {b_t['sec']:.1f} s, peak {b_t['peak_rss_mb']:.0f} MB -> rlzoo {b_t['sec'] / b_r['sec']:.2f}x "
            f"TRL per batch, peak RSS {b_r['peak_rss_mb'] / b_t['peak_rss_mb']:.2f}x TRL's"
        )
        fp32 = {
            side: min(
                (r for r in rows if r["side"] == side and r["precision"] == "fp32" and "error" not in r),
                key=lambda r: r["sec"],
                default=None,
            )
            for side in ("rlzoo", "trl")
        }
        if fp32["rlzoo"] and fp32["trl"]:
            print(f"fp32 against fp32 (fastest of each): {fp32['trl']['sec'] / fp32['rlzoo']['sec']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="smollm2")
    ap.add_argument(
        "--configs",
        nargs="+",
        default=list(DEFAULT_CONFIGS),
        help="side:precision:micro[:packed][:omp=POLICY]",
    )
    ap.add_argument("--max-new", type=int, default=None, help="response limit (default: the recipe's, 16)")
    ap.add_argument("--ignore-eos", action="store_true", help="responses run to --max-new on both sides")
    ap.add_argument(
        "--steps",
        type=int,
        default=3,
        help="batches per configuration; the first is a warm-up (1: the one batch is measured)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ns = ap.parse_args()
    if ns.child:
        child(json.loads(ns.child))
        return
    cfgs = [parse_config(c) for c in ns.configs]
    s = settings(ns.model, ns.max_new)
    if not (s["dir"] / "train.parquet").exists():  # prepare once, as `rlzoo train` would
        comp = rlzoo.get_plugin_manager().get(
            "dataset", "quickstart" if ns.model == "tiny" else "smollm2_arith"
        )
        comp.load()(s["dir"], comp.default_params())
    if ns.ignore_eos:
        no_eos_model(s["model"])
    title = (
        f"{ns.model}: {PROMPTS} prompts x {N} samples, <= {s['max_new']} new tokens"
        f"{' (EOS ignored)' if ns.ignore_eos else ''}, one optimizer step per batch, "
        + (f"median of {ns.steps - 1} batch(es) after 1 warm-up" if ns.steps > 1 else "1 batch, no warm-up")
        + f", {os.cpu_count()} CPUs"
    )
    rows = []
    for c in cfgs:
        c.update(
            model=ns.model, max_new=ns.max_new, ignore_eos=ns.ignore_eos, steps=ns.steps, threads=ns.threads
        )
        rows.append(run_config(c))
        print_table(rows, title)
        sys.stdout.flush()
    if shutil.which("uptime"):
        print("load at the end:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
