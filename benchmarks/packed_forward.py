"""A policy update's forward + backward on SmolLM2-135M-Instruct, padded against padding-free.

The work: ``--prompts`` prompts x ``--n`` answers (GRPO's groups), ``--micro`` rows per forward;
log-probs of the answers, a token-mean loss with random advantages, backward. The prompts are the
recipe's own (``grpo_smollm2_arith``'s train parquet through the chat template), the answers
random tokens of ``--answer`` lengths: a fixed length, or ``tail`` (a few to 256 tokens, long-tailed,
as ``grpo_smollm2_count`` answers). Each configuration, side by side in one process, alternated
over ``--repeats`` rounds (the median is printed):

- ``padded``: rows padded to the micro-batch's longest (the trimmed columns), transformers' sdpa;
- ``packed (transformers)``: padding-free, transformers' sdpa on the packed row (one ``[N, N]``
  mask; every pair of the row scored), rlzoo's padding-free forward before ``train_kit.attention``;
- ``packed``: padding-free, each sequence's attention on its own (``train_kit.attention``);
- ``packed, shared prompts``: as ``packed``, each group's prompt once (rlzoo's default with
  ``use_remove_padding``).

Needs the model (``rlzoo prepare smollm2_arith``; see benchmarks/smollm2.py); falls back to a
random model of SmolLM2-135M's shape when it is absent (the times are the same).

    python benchmarks/packed_forward.py                       # answers of 16 and tail, micro 16
    python benchmarks/packed_forward.py --answer 256 --micro 16
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from rlzoo.kernel.batch import Batch
from rlzoo.train_kit import attention, logprobs
from rlzoo.train_kit.logprobs import actor_log_probs

MODES = ("padded", "packed (transformers)", "packed", "packed, shared prompts")


def load_model() -> tuple[Any, Any, str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    cache = Path(os.environ.get("RLZOO_CACHE", Path.home() / ".cache" / "rlzoo")) / "smollm2_arith"
    if (cache / "model" / "config.json").exists():
        model = AutoModelForCausalLM.from_pretrained(
            cache / "model", dtype=torch.float32, attn_implementation="sdpa"
        )
        return model, AutoTokenizer.from_pretrained(cache / "model"), str(cache / "model")
    cfg = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
        rope_theta=100000.0,
    )
    cfg._attn_implementation = "sdpa"
    return (
        AutoModelForCausalLM.from_config(cfg),
        None,
        "random SmolLM2-135M shape (rlzoo prepare smollm2_arith absent)",
    )


def prompts(tokenizer: Any, count: int) -> list[list[int]]:
    if tokenizer is None:
        return [[random.randrange(100, 49000) for _ in range(45)] for _ in range(count)]
    import pyarrow.parquet as pq

    cache = Path(os.environ.get("RLZOO_CACHE", Path.home() / ".cache" / "rlzoo")) / "smollm2_arith"
    rows = pq.read_table(cache / "train.parquet").to_pylist()[:count]
    texts = [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows
    ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def answer_lengths(spec: str, count: int, rng: random.Random) -> list[int]:
    if spec == "tail":  # a few to 256 tokens, most short (grpo_smollm2_count's answers)
        return [max(3, min(256, int(rng.expovariate(1 / 60)))) for _ in range(count)]
    return [int(spec)] * count


def make_batch(ps: list[list[int]], n: int, lengths: list[int], rng: random.Random) -> Batch:
    rows = [
        (p, [rng.randrange(100, 49000) for _ in range(lengths[i * n + j])])
        for i, p in enumerate(ps)
        for j in range(n)
    ]
    P, T = max(len(p) for p, _ in rows), max(len(r) for _, r in rows)
    ids = torch.zeros(len(rows), P + T, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for k, (p, r) in enumerate(rows):
        ids[k, P - len(p) : P], attn[k, P - len(p) : P] = torch.tensor(p), 1
        ids[k, P : P + len(r)], attn[k, P : P + len(r)] = torch.tensor(r), 1
    mask = attn[:, P:].float()
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": attn,
            "responses": ids[:, P:],
            "response_mask": mask,
            "advantages": torch.randn(len(rows), T) * mask,
        }
    )


def step(model: Any, batch: Batch, micro: int, packed: bool) -> float:
    tokens = float(batch["response_mask"].sum())
    t0 = time.perf_counter()
    for mb in batch.split(micro):
        lp, _ = actor_log_probs(model, mb, keep_arg=True, temperature=1.0, with_entropy=False, packed=packed)
        (-(lp * mb["advantages"]).sum() / tokens).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--answer", nargs="+", default=["16", "tail"], help="answer length(s): a number, or tail")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    args = ap.parse_args()
    torch.manual_seed(0)
    base, tok, what = load_model()
    hf = base
    ours = copy.deepcopy(base)
    attention.install(ours)
    rng = random.Random(0)
    ps = prompts(tok, args.prompts)
    print(
        f"model: {what}; {args.prompts} prompts x {args.n} answers, micro-batches of {args.micro}, "
        f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} at start"
    )
    for spec in args.answer:
        lengths = answer_lengths(spec, args.prompts * args.n, rng)
        batch = make_batch(ps, args.n, lengths, rng)
        times: dict[str, list[float]] = {m: [] for m in args.modes}
        for _ in range(args.repeats):
            for mode in args.modes:
                if mode == "padded":
                    t = step(hf, batch, args.micro, packed=False)
                elif mode == "packed (transformers)":
                    t = step(hf, batch, args.micro, packed=True)
                elif mode == "packed":
                    # each row with its own copy of its prompt (the layout before prompt sharing)
                    real = logprobs.shares_prompts
                    logprobs.shares_prompts = lambda _m: False  # type: ignore[assignment]
                    try:
                        t = step(ours, batch, args.micro, packed=True)
                    finally:
                        logprobs.shares_prompts = real
                else:
                    t = step(ours, batch, args.micro, packed=True)
                times[mode].append(t)
        mean_p = statistics.mean(len(p) for p in ps)
        print(
            f"\nanswers {spec}: mean {statistics.mean(lengths):.0f} tokens (max {max(lengths)}), prompts {mean_p:.0f} tokens; load {os.getloadavg()[0]:.1f}"
        )
        print(f"| forward + backward of {len(lengths)} samples | s (median of {args.repeats}) | vs padded |")
        print("|---|---:|---:|")
        ref = statistics.median(times[args.modes[0]])
        for mode in args.modes:
            t = statistics.median(times[mode])
            print(f"| {mode} | {t:.2f} | {ref / t:.2f}x |")


if __name__ == "__main__":
    main()
