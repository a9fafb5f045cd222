"""The native engine's decoding, KV cache with spare columns against concatenation, on SmolLM2-135M.

The work: ``--prompts`` of ``grpo_smollm2_arith``'s prompts x ``--n`` samples, every answer
exactly ``--new`` tokens (no end-of-sequence token, temperature 1.0), decoded together by one
:class:`~rlzoo.backends.native.engine.NativeEngine` (fp32). Two ways of keeping the KV cache,
alternated in one process over ``--repeats`` rounds (the median is printed), the same tokens:

- ``spare columns``: the engine's (:mod:`rlzoo.backends.native.kv`): a decode step writes its
  column into buffers with spare columns;
- ``concatenation``: transformers' ``DynamicLayer``, which ``torch.cat``s every layer's whole keys
  and values at every decode step (the engine before).

Needs the model (``rlzoo prepare smollm2_arith``), else a random model of its shape.

    python benchmarks/kv_cache.py                                  # 64 x 256 and 16 x 768 tokens
    python benchmarks/kv_cache.py --runs 8x8x256 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
from packed_forward import load_model, prompts

from rlzoo.backends.native.engine import NativeEngine
from rlzoo.kernel.protocols import GenerationRequest, SamplingParams

MODES = ("spare columns", "concatenation")


def decode(model: Any, ps: list[list[int]], n: int, new: int, mode: str) -> tuple[float, list[list[int]]]:
    spare = 0 if mode == "concatenation" else None  # None: the engine's default
    engine = NativeEngine(model, eos_token_ids=(), max_num_seqs=len(ps) * n, kv_spare_columns=spare)
    reqs = [
        GenerationRequest(f"p{i}", p, SamplingParams(n=n, max_new_tokens=new, seed=i))
        for i, p in enumerate(ps)
    ]
    t0 = time.perf_counter()
    out = engine.generate(reqs)
    return time.perf_counter() - t0, [s.response_ids for s in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--runs",
        nargs="+",
        default=["8x8x256", "2x8x768"],
        help="PROMPTSxNxNEW: prompts, samples, new tokens",
    )
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    model, tok, what = load_model()
    print(f"model: {what}; torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    rows = []
    for spec in args.runs:
        p, n, new = (int(x) for x in spec.split("x"))
        ps = prompts(tok, p)
        times: dict[str, list[float]] = {m: [] for m in MODES}
        tokens: dict[str, list[list[int]]] = {}
        for _ in range(args.repeats):
            for mode in MODES:
                t, toks = decode(model, ps, n, new, mode)
                times[mode].append(t)
                tokens.setdefault(mode, toks)
        same = tokens[MODES[0]] == tokens[MODES[1]]
        med = {m: statistics.median(times[m]) for m in MODES}
        rows.append((spec, med, same, os.getloadavg()[0]))
        print(f"{spec}: {times} same tokens: {same}", flush=True)
    print(
        "\n| answers (prompts x n x tokens) | spare columns s | concatenation s | speed-up | same tokens | load |"
    )
    print("|---|---:|---:|---:|---|---:|")
    for spec, med, same, load in rows:
        a, b = med[MODES[0]], med[MODES[1]]
        print(f"| {spec} | {a:.1f} | {b:.1f} | {b / a:.2f}x | {same} | {load:.1f} |")


if __name__ == "__main__":
    main()
