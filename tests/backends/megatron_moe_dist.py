"""Worker for ``test_megatron_parallel.py``: megatron-core's MoE layer with expert parallelism 2
against the same model unsplit (EP=1), on a gloo group on the CPU (``torchrun --nproc_per_node=2
megatron_moe_dist.py DISPATCHER``, DISPATCHER ``alltoall`` or ``allgather``).

Both runs are data-parallel over the 2 ranks with the same rows per rank; only where the experts
live differs (EP=1: every rank holds all 4; EP=2: rank r holds experts 2r, 2r+1, and the allgather
dispatcher sends tokens to them). Weights are drawn once from a seeded generator in the EP=1
names and sliced for EP=2. One step of megatron's schedule, DDP (``finalize_model_grads``) and
Adam; the loss, every gradient and every parameter after the step are gathered into EP=1 names
and compared on each rank. Prints ``MOE EP2 == EP1`` with the largest differences on success.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import Any

import torch
import torch.distributed as dist

from rlzoo.backends.megatron.convert import ModelDims, transformer_config_kwargs
from rlzoo.backends.megatron.cpu import cpu_device

EXPERTS, TOPK = 4, 2
DIMS = ModelDims(
    num_layers=2,
    hidden_size=32,
    ffn_hidden_size=48,
    num_attention_heads=4,
    num_query_groups=2,
    head_dim=8,
    vocab_size=64,
)
VOCAB_PADDED = 128
DISPATCHER = sys.argv[1] if len(sys.argv) > 1 else "alltoall"  # or 'allgather'
#: 'cpu' (gloo, megatron's CUDA calls sent to the CPU) or 'cuda' (NCCL, one GPU a rank:
#: benchmarks/gpu_check.py)
DEVICE = os.environ.get("RLZOO_MOE_DEVICE", "cpu")
_EXPERT = re.compile(r"(.*\.local_experts\.)(\d+)(\..*)")


def global_name(name: str, ep: int, ep_rank: int) -> str:
    """A parameter's name in the EP=1 model (local expert i of EP rank r is expert r*E/ep + i)."""
    m = _EXPERT.fullmatch(name)
    if m is None:
        return name
    return f"{m[1]}{ep_rank * (EXPERTS // ep) + int(m[2])}{m[3]}"


def full_dict(local: dict[str, torch.Tensor], ep: int) -> dict[str, torch.Tensor]:
    """This rank's tensors in EP=1 names, experts collected from every EP rank (all ranks)."""
    from megatron.core import parallel_state as mpu

    group = mpu.get_expert_model_parallel_group()
    out: dict[str, torch.Tensor] = {}
    for name, t in local.items():
        if _EXPERT.fullmatch(name) is None:
            out[name] = t.detach().clone()
            continue
        parts = [torch.zeros_like(t) for _ in range(ep)]
        dist.all_gather(parts, t.detach().contiguous(), group=group)
        for r, part in enumerate(parts):
            out[global_name(name, ep, r)] = part
    return out


def run(ep: int, init: dict[str, torch.Tensor], ids: torch.Tensor, gen: torch.Generator) -> dict[str, Any]:
    from megatron.core import parallel_state as mpu
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import initialize_rng_tracker
    from megatron.core.transformer import TransformerConfig

    mpu.initialize_model_parallel(expert_model_parallel_size=ep)
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    ep_rank = mpu.get_expert_model_parallel_rank()
    config = TransformerConfig(
        **transformer_config_kwargs(
            DIMS,
            params_dtype=torch.float32,
            pipeline_dtype=torch.float32,
            perform_initialization=False,
            use_cpu_initialization=DEVICE == "cpu",
            calculate_per_token_loss=True,
            num_moe_experts=EXPERTS,
            moe_router_topk=TOPK,
            moe_ffn_hidden_size=24,
            moe_token_dispatcher_type=DISPATCHER,
            variable_seq_lengths=DISPATCHER != "allgather",  # allgather refuses variable lengths
            expert_model_parallel_size=ep,
            moe_aux_loss_coeff=0.0,
            moe_router_load_balancing_type="none",
        )
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(num_experts=EXPERTS, normalization="RMSNorm"),
        vocab_size=VOCAB_PADDED,
        max_sequence_length=64,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    ).to(DEVICE)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ep == 1 and name not in init:  # drawn once in EP=1 names (the same on every rank)
                init[name] = torch.randn(p.shape, generator=gen) * 0.1
            p.copy_(init[global_name(name, ep, ep_rank)].to(DEVICE))
    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=False),
        model,
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam", lr=1e-2, weight_decay=0.0, clip_grad=0.0, params_dtype=torch.float32
        ),
        [ddp],
    )
    config.finalize_model_grads_func = lambda models, *a, **k: finalize_model_grads(models, None)
    config.no_sync_func = ddp.no_sync

    half = ids.shape[0] // dist.get_world_size()
    mine = ids[dist.get_rank() * half : (dist.get_rank() + 1) * half].to(DEVICE)
    losses: list[torch.Tensor] = []

    def step(data: Any, module: Any) -> tuple[torch.Tensor, Any]:
        x = next(data)
        pos = torch.arange(x.shape[1], device=x.device)[None].expand_as(x)
        logits = module(input_ids=x, position_ids=pos, attention_mask=None)  # causal by default

        def loss_func(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
            lp = out[:, :-1, : DIMS.vocab_size].float().log_softmax(-1)
            loss = -lp.gather(-1, x[:, 1:, None]).sum() / ids[:, 1:].numel()  # mean over the global batch
            losses.append(loss.detach())
            return loss, torch.ones((), dtype=torch.int, device=x.device), {"loss": loss.detach()}

        return logits, loss_func

    ddp.train()
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    get_forward_backward_func()(
        forward_step_func=step,
        data_iterator=iter([mine]),
        model=[ddp],
        num_microbatches=1,
        seq_length=ids.shape[1],
        micro_batch_size=half,
        forward_only=False,
    )
    grads = full_dict({n: p.main_grad for n, p in model.named_parameters()}, ep)
    ok, _, _ = optimizer.step()
    assert ok, "the optimizer step was skipped"
    params = full_dict(dict(model.named_parameters()), ep)
    grads, params = ({n: t.cpu() for n, t in d.items()} for d in (grads, params))
    loss = torch.stack(losses).sum().reshape(1)
    dist.all_reduce(loss)
    mpu.destroy_model_parallel()
    return {"loss": loss.cpu(), "grads": grads, "params": params}


def main() -> None:
    """EP=1 then EP=2 (EP=1 alone in a one-rank world: a check that the MoE step runs at all)."""
    if DEVICE == "cuda":
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        context: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    else:
        dist.init_process_group("gloo")
        context = cpu_device()
    with context:
        import megatron.core.transformer.moe.moe_utils as moe_utils
        import megatron.core.transformer.moe.token_dispatcher as token_dispatcher

        from rlzoo.backends.megatron.cpu import patch_moe

        patch_moe(moe_utils, token_dispatcher)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, DIMS.vocab_size, (4, 12), generator=gen)
        init: dict[str, torch.Tensor] = {}
        one = run(1, init, ids, gen)
        if dist.get_world_size() == 1:
            print(f"MOE {DISPATCHER} EP1 ran on {DEVICE}: loss={float(one['loss'][0]):.6f}")
            dist.destroy_process_group()
            return
        two = run(2, init, ids, gen)
    assert len(init) > 0 and any(_EXPERT.fullmatch(n) for n in init), sorted(init)
    diffs = {"loss": float((one["loss"] - two["loss"]).abs().max())}
    for what in ("grads", "params"):
        assert one[what].keys() == two[what].keys(), (what, sorted(one[what]), sorted(two[what]))
        diffs[what] = max(float((one[what][n] - two[what][n]).abs().max()) for n in one[what])
    moved = max(float((one["params"][n] - init[n]).abs().max()) for n in init)
    assert moved > 1e-3, f"the step changed nothing ({moved})"
    assert all(d < 1e-5 for d in diffs.values()), diffs
    if dist.get_rank() == 0:
        print(f"MOE {DISPATCHER} EP2 == EP1 on {DEVICE}: loss={float(one['loss'][0]):.6f} max|diff| {diffs}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
