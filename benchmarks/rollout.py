"""Native rollout engine (continuous batching) vs HF ``model.generate`` in static batches.

One command, prints a table::

    python benchmarks/rollout.py [--requests 128] [--batch 32] [--cap 256] [--device cpu] [--threads 1]

Same random-weight Qwen2 (~7M params, built from a config), same prompts, same per-request
``max_new_tokens`` drawn from a long-tailed distribution (most responses short, a few at the cap),
EOS disabled so every response runs to its own cap. ``model.generate`` gets static batches of
``--batch`` requests and must decode each batch until its longest member is done; the native
engine runs ``--batch`` slots and refills a slot as soon as its sequence ends. Both sample at
temperature 1. Only useful tokens count: each request's own ``max_new_tokens``.
"""

from __future__ import annotations

import argparse
import time

import torch

from rlzoo.models.tiny import tiny_qwen2_config


def build_model(device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = tiny_qwen2_config(
        8192,
        hidden_size=256,
        num_layers=4,
        intermediate_size=768,
        max_position_embeddings=1024,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )
    return AutoModelForCausalLM.from_config(cfg).to(device=device, dtype=dtype).eval()


def workload(num: int, cap: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """Prompts of 16..64 tokens; max_new_tokens lognormal (median ~20), clipped to [4, cap]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 65, (num,), generator=g).tolist()
    prompts = [torch.randint(1, 8192, (n,), generator=g).tolist() for n in lengths]
    draws = torch.empty(num).log_normal_(mean=3.0, std=1.0, generator=g)
    max_new = draws.round().clamp(4, cap).long().tolist()
    return prompts, max_new


@torch.inference_mode()
def run_hf(model, prompts, max_new, batch: int, device: str) -> tuple[float, int, int]:
    """(seconds, useful tokens, decoded tokens incl. waste) for static-batch model.generate."""
    t0 = time.perf_counter()
    useful = decoded = 0
    for start in range(0, len(prompts), batch):
        ps, ms = prompts[start : start + batch], max_new[start : start + batch]
        width = max(map(len, ps))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in ps], device=device)  # [b, P]
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps], device=device)  # [b, P]
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max(ms),
            min_new_tokens=max(ms),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            pad_token_id=0,
        )
        gen = out.shape[1] - width
        decoded += gen * len(ps)
        useful += sum(min(m, gen) for m in ms)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0, useful, decoded


def run_native(model, prompts, max_new, batch: int) -> tuple[float, int, int, dict]:
    from rlzoo.backends.native.engine import NativeEngine
    from rlzoo.kernel.protocols import GenerationRequest, SamplingParams

    reqs = [
        GenerationRequest(f"r{i}", p, SamplingParams(max_new_tokens=m, temperature=1.0))
        for i, (p, m) in enumerate(zip(prompts, max_new))
    ]
    engine = NativeEngine(model, max_num_seqs=batch, pad_token_id=0, seed=0)
    t0 = time.perf_counter()
    samples = engine.generate(reqs)
    elapsed = time.perf_counter() - t0
    useful = sum(len(s.response_ids) for s in samples)
    return elapsed, useful, engine.stats["tokens"], engine.stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32, help="HF static batch size = native slots")
    ap.add_argument("--cap", type=int, default=256, help="largest max_new_tokens")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: steady timings on a shared machine)"
    )
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    dtype = getattr(torch, args.dtype)
    model = build_model(args.device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    prompts, max_new = workload(args.requests, args.cap, args.seed)
    short = sum(m <= 32 for m in max_new)
    at_cap = sum(m == args.cap for m in max_new)

    # warm-up (allocator, kernels)
    run_native(model, prompts[: args.batch], [4] * args.batch, args.batch)
    run_hf(model, prompts[: args.batch], [4] * args.batch, args.batch, args.device)

    hf_s, hf_useful, hf_decoded = run_hf(model, prompts, max_new, args.batch, args.device)
    nat_s, nat_useful, nat_decoded, stats = run_native(model, prompts, max_new, args.batch)
    assert hf_useful == nat_useful == sum(max_new), (hf_useful, nat_useful, sum(max_new))

    print(
        f"model: Qwen2 random init, {n_params / 1e6:.1f}M params, {args.dtype}, {args.device}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(
        f"workload: {args.requests} requests, prompts 16-64 tokens, max_new_tokens lognormal clipped to "
        f"[4, {args.cap}] (median {sorted(max_new)[len(max_new) // 2]}, {short} <= 32, {at_cap} at the cap), "
        f"batch/slots {args.batch}, temperature 1.0"
    )
    rows = [
        ("HF generate (static batches)", hf_s, hf_useful, hf_decoded),
        ("native (continuous batching)", nat_s, nat_useful, nat_decoded),
    ]
    print(
        f"{'engine':<30} {'seconds':>8} {'useful tok':>11} {'decoded tok':>12} {'useful tok/s':>13} {'speed-up':>9}"
    )
    for name, secs, useful, decoded in rows:
        print(
            f"{name:<30} {secs:>8.2f} {useful:>11d} {decoded:>12d} {useful / secs:>13.0f} "
            f"{(useful / secs) / (hf_useful / hf_s):>8.2f}x"
        )
    print(
        f"native: {stats['decode_forwards']} decode steps, {stats['prefill_forwards']} prefill forwards, "
        f"mean batch {stats['tokens'] / max(1, stats['decode_forwards']):.1f} of {args.batch}"
    )


if __name__ == "__main__":
    main()
