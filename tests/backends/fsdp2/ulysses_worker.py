"""torchrun worker for tests/backends/fsdp2/test_ulysses.py.

    torchrun --nproc_per_node=W tests/backends/fsdp2/ulysses_worker.py equality OUT_DIR SIZES...
    torchrun --nproc_per_node=2 tests/backends/fsdp2/ulysses_worker.py memory OUT_DIR SIZE

``equality``: for each Ulysses size in SIZES (1 first; the others also with activation
checkpointing and with eager attention), the same scenario on the same tiny model
and batches: actor log-probs + entropies, reference log-probs, ``sum_pi_squared``, critic values,
one actor update (an objective with an entropy term) and two critic updates; the clipped gradients
handed to the optimizer and the weights after the step are all-gathered. Rank 0 writes
``OUT_DIR/u{size}.safetensors`` and ``OUT_DIR/u{size}.json``.

``memory``: the bytes each rank keeps for the backward (tensors saved by autograd, unique storages,
counted by ``torch.autograd.graph.saved_tensors_hooks``) during the forward of one long sequence,
and the process's peak RSS (``ru_maxrss``) before and after its forward + backward, for one
ulysses_size per launch (a fresh process: the peak is the process's own); rank 0 writes
``OUT_DIR/memory_u{SIZE}.json``.
"""

from __future__ import annotations

import json
import logging
import random
import resource
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parents[1]))
from fsdp2_worker import TokenMeanPG, TokenMeanValue, V, sample_batch

from rlzoo.kernel.batch import Batch
from rlzoo.kernel.settings import MicroBatchSettings, OptimSettings, TrainSpec
from rlzoo.models.tiny import tiny_llama_config, tiny_qwen2_config
from rlzoo.testing.backends import make_train_batch


def tiny(arch: str, seed: int = 0, attn: str = "sdpa", **overrides: Any) -> torch.nn.Module:
    """``qwen2``: 4 heads, 2 KV heads (GQA); ``llama``: 4 heads, 4 KV heads; fp32."""
    torch.manual_seed(seed)
    if arch == "llama":
        cfg = tiny_llama_config(V, num_key_value_heads=4, attn_implementation=attn, **overrides)
    else:
        cfg = tiny_qwen2_config(V, attn_implementation=attn, **overrides)
    return AutoModelForCausalLM.from_config(cfg).float()


class PGWithEntropy(TokenMeanPG):
    """:class:`TokenMeanPG` minus ``0.1 * sum(entropy * mask) / global_tokens``: the entropy's
    gradient goes through the SP gather too."""

    needs_entropy = True

    def __call__(self, mb: Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None) -> tuple[Any, dict]:
        loss, metrics = super().__call__(mb, log_probs, entropy)
        assert entropy is not None
        return loss - 0.1 * (entropy * mb["response_mask"]).sum() / self.ctx.global_tokens, metrics


def spec(**micro: Any) -> TrainSpec:
    return TrainSpec(
        model_path="",
        need_reference=True,
        need_critic=True,
        total_steps=10,
        optim=OptimSettings(lr=1e-3, grad_clip=1.0, critic_lr=1e-3),
        micro_batch=MicroBatchSettings(**{"size": 2, "log_prob_size": 2, **micro}),
    )


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _capture_grads(optimizer: torch.optim.Optimizer, module: torch.nn.Module, into: dict) -> None:
    """Wrap ``optimizer.step``: first all-gather every gradient of ``module`` into ``into``."""
    step = optimizer.step

    def wrapped(*a: Any, **k: Any) -> Any:
        for n, p in module.named_parameters():
            if p.grad is not None:
                into[n] = _full(p.grad)
        return step(*a, **k)

    optimizer.step = wrapped  # type: ignore[method-assign]


def equality(out: Path, sizes: list[int]) -> None:
    import torch.distributed as dist

    from rlzoo.backends.fsdp2 import FSDP2Params
    from rlzoo.backends.fsdp2.train import FSDP2TrainBackend

    world = dist.get_world_size()
    arch = "qwen2" if world == 2 else "llama"
    b1 = sample_batch(1)
    b_long = make_train_batch([[3] * 13, [5, 6]], [[7] * 17, [9, 10, 11]], seed=3)  # uneven pieces
    for size in sizes:
        # sdpa; activation checkpointing (the layers recomputed in the backward); eager attention
        for variant in ("", "_ckpt", "_eager") if size > 1 else ("",):
            tag = f"u{size}{variant}"
            tensors: dict[str, torch.Tensor] = {}
            numbers: dict[str, Any] = {}
            params = FSDP2Params(device="cpu", ulysses_size=size, gradient_checkpointing=variant == "_ckpt")
            attn = "eager" if variant == "_eager" else "sdpa"
            be = FSDP2TrainBackend(params, spec(), model=tiny(arch, attn=attn))
            tensors["lp"], tensors["ent"] = be.compute_log_probs(b1, with_entropy=True)  # type: ignore[assignment]
            tensors["lp_long"] = be.compute_log_probs(b_long)[0]
            tensors["sps_lp"], tensors["sps"] = be.compute_log_probs_and_sum_pi_squared(b1)
            tensors["values0"] = be.compute_values(b1)
            actor_grads: dict[str, torch.Tensor] = {}
            critic_grads: dict[str, torch.Tensor] = {}
            _capture_grads(be.optimizer, be.actor, actor_grads)
            assert be.critic is not None and be.critic_optimizer is not None
            _capture_grads(be.critic_optimizer, be.critic, critic_grads)
            numbers["actor"] = be.update_policy(b1, PGWithEntropy(b1))
            numbers["critic"] = be.update_critic(b1, TokenMeanValue(b1))
            # the value head starts at zero, so the backbone's first gradient is zero: a second step
            numbers["critic2"] = be.update_critic(b_long, TokenMeanValue(b_long))  # grads captured: these
            tensors["ref_lp"] = be.compute_log_probs(b1, model="ref")[0]
            tensors["lp1"] = be.compute_log_probs(b1)[0]
            tensors["values1"] = be.compute_values(b1)
            for n, t in actor_grads.items():
                tensors[f"grad/actor/{n}"] = t
            for n, t in critic_grads.items():
                tensors[f"grad/critic/{n}"] = t
            for n, t in be.export_weights():
                tensors[f"w/actor/{n}"] = t.clone()
            for n, p in be.critic.named_parameters():
                tensors[f"w/critic/{n}"] = _full(p)
            be.shutdown()
            if dist.get_rank() == 0:
                from safetensors.torch import save_file

                save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / f"{tag}.safetensors"))
                (out / f"{tag}.json").write_text(json.dumps(numbers, indent=1))
            dist.barrier()


def _saved_bytes(fn: Any) -> tuple[Any, int]:
    """``fn()`` and the bytes of the distinct storages autograd saved for the backward meanwhile."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def memory(out: Path, size: int, length: int = 4096) -> None:
    """One sample of ``length`` tokens (half prompt), a wider Qwen2 (hidden 256, 8 heads, 4 KV
    heads, 2 layers): saved-activation bytes of the actor's forward and the ru_maxrss rise."""
    import torch.distributed as dist

    from rlzoo.backends.fsdp2 import FSDP2Params
    from rlzoo.backends.fsdp2.train import FSDP2TrainBackend

    rng = random.Random(0)
    half = length // 2
    batch = make_train_batch(
        [[rng.randrange(1, V) for _ in range(half)]], [[rng.randrange(1, V) for _ in range(half)]], seed=0
    )
    model = tiny("qwen2", hidden_size=256, num_attention_heads=8, num_key_value_heads=4)
    be = FSDP2TrainBackend(
        FSDP2Params(device="cpu", ulysses_size=size), spec(log_prob_chunk=1024), model=model
    )
    objective = TokenMeanPG(batch)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    (lp, _), saved = _saved_bytes(
        lambda: be._actor_forward(be.actor, batch, with_entropy=False, temperature=1.0)
    )
    loss, _ = objective(batch, lp, None)
    loss.backward()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(
        gathered, {"saved_bytes": saved, "peak_rss_kib": rss1, "peak_rss_rise_kib": rss1 - rss0}
    )
    be.shutdown()
    if dist.get_rank() == 0:
        result = {"length": length, "world": dist.get_world_size(), "ulysses_size": size, "ranks": gathered}
        (out / f"memory_u{size}.json").write_text(json.dumps(result, indent=1))
    dist.barrier()


def _main(mode: str, out: Path, sizes: list[int]) -> None:
    import torch.distributed as dist

    from rlzoo.backends.fsdp2.collectives import ensure_process_group

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    ensure_process_group("cpu")
    if mode == "equality":
        equality(out, sizes)
    else:
        memory(out, sizes[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    _main(sys.argv[1], Path(sys.argv[2]), [int(x) for x in sys.argv[3:]])
