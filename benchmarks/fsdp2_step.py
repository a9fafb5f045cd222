"""One FSDP2 training step on a ~0.5B Qwen2 (bf16 mixed precision): tokens/s and MFU per GPU.

    torchrun --nproc_per_node=N benchmarks/fsdp2_step.py                 # GPU, Qwen2.5-0.5B shape
    python benchmarks/fsdp2_step.py --device cpu --tiny --steps 2        # CPU smoke run

Random weights from a config (nothing is downloaded). Each step is a full ``update_policy`` on a
random mini-batch (prompt + response tokens), with a token-mean policy-gradient objective; the
first ``--warmup`` steps are not timed. MFU uses the usual ``6 * params * tokens`` training FLOPs
(+ attention ``12 * layers * hidden * seq`` per token) over the GPU's dense bf16 peak (``--peak-tflops``,
default 989 for an H100 SXM). Prints a table on rank 0.
"""

from __future__ import annotations

import argparse
import time

import torch

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.protocols import AggContext
from rlzoo.kernel.settings import MicroBatchSettings, OptimSettings, TrainSpec
from rlzoo.models.tiny import tiny_qwen2_config
from rlzoo.testing.backends import make_train_batch


def qwen2_config(tiny: bool):  # type: ignore[no-untyped-def]
    from transformers import Qwen2Config

    if tiny:  # 2 layers, hidden 64, 4 heads / 2 KV heads, FFN 128, vocab 256, tied
        return tiny_qwen2_config(256, hidden_size=64, num_layers=2, tie_word_embeddings=True)
    # Qwen2.5-0.5B shape: 24 layers, hidden 896, 14 heads / 2 KV heads, FFN 4864, vocab 151936, tied
    return Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
    )


def random_batch(B: int, P: int, T: int, vocab: int, seed: int) -> Batch:
    """B samples with random prompt (P/2..P) and response (T/2..T) lengths and random token ids,
    in the train layout of :func:`rlzoo.testing.backends.make_train_batch`."""
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(P // 2, P + 1, (B,), generator=g).tolist()
    rlen = torch.randint(T // 2, T + 1, (B,), generator=g).tolist()
    prompts = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in plen]
    responses = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in rlen]
    batch: Batch = make_train_batch(prompts, responses, seed)
    return batch


class TokenMeanPG:
    needs_entropy = False

    def __init__(self, mini_batch: Batch) -> None:
        self.ctx = AggContext(global_tokens=float(mini_batch["response_mask"].sum()), global_sequences=1.0)

    def __call__(self, mb, log_probs, entropy):  # type: ignore[no-untyped-def]
        ratio = torch.exp(log_probs - mb["old_log_probs"])  # [b, T]
        return -(mb["advantages"] * ratio * mb["response_mask"]).sum() / self.ctx.global_tokens, {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="a ~100k-parameter model (smoke run)")
    ap.add_argument("--batch", type=int, default=64, help="samples per mini-batch (all ranks together)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--response-len", type=int, default=1024)
    ap.add_argument("--max-tokens-per-micro-batch", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-remove-padding", action="store_true")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--offload", action="store_true")
    ap.add_argument("--attn", default=None, help="attn_implementation (default: sdpa)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak per GPU")
    a = ap.parse_args()
    if a.tiny:
        a.prompt_len, a.response_len, a.batch = (
            min(a.prompt_len, 16),
            min(a.response_len, 24),
            min(a.batch, 8),
        )

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlzoo.backends.fsdp2 import FSDP2Params
    from rlzoo.backends.fsdp2.train import FSDP2TrainBackend

    cfg = qwen2_config(a.tiny)
    cfg._attn_implementation = a.attn or "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    params = FSDP2Params(
        device=a.device,
        use_remove_padding=not a.no_remove_padding,
        gradient_checkpointing=a.gradient_checkpointing,
        offload=a.offload,
        mixed_precision=True,
        attn_implementation=a.attn,
    )
    spec = TrainSpec(
        model_path="",
        total_steps=a.steps + a.warmup,
        optim=OptimSettings(lr=1e-6),
        micro_batch=MicroBatchSettings(max_tokens=a.max_tokens_per_micro_batch),
    )
    be = FSDP2TrainBackend(params, spec, model=model)
    world = dist.get_world_size()
    times, tokens = [], []
    for step in range(a.warmup + a.steps):
        b = random_batch(a.batch, a.prompt_len, a.response_len, cfg.vocab_size, seed=step)
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        be.update_policy(b, TokenMeanPG(b))
        if a.device == "cuda":
            torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
            tokens.append(int(b["attention_mask"].sum()))
    if dist.get_rank() == 0:
        secs, toks = sum(times), sum(tokens)
        seq = a.prompt_len + a.response_len
        flops_per_token = 6 * n_params + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq
        tps_gpu = toks / secs / world
        mfu = tps_gpu * flops_per_token / (a.peak_tflops * 1e12) if a.device == "cuda" else float("nan")
        mem = torch.cuda.max_memory_allocated() / 2**30 if a.device == "cuda" else float("nan")
        rows = [
            ("model params", f"{n_params / 1e6:.1f} M"),
            ("world size", str(world)),
            ("device", a.device + (f" ({torch.cuda.get_device_name()})" if a.device == "cuda" else "")),
            ("remove padding", str(not a.no_remove_padding)),
            ("tokens / step", f"{toks / len(times):.0f}"),
            ("step time (s)", f"{secs / len(times):.3f}"),
            ("tokens / s / device", f"{tps_gpu:.0f}"),
            ("MFU", f"{100 * mfu:.1f} %"),
            ("peak memory (GiB)", f"{mem:.2f}"),
        ]
        width = max(len(k) for k, _ in rows)
        print(f"{'metric':<{width}} | value\n{'-' * width}-+-{'-' * 24}")
        for k, v in rows:
            print(f"{k:<{width}} | {v}")
    be.shutdown()


if __name__ == "__main__":
    main()
