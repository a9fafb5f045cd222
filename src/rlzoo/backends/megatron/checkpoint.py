"""Checkpoints of :mod:`.train`: megatron ``dist_checkpointing`` (every rank writes its shards) with
the optimizers' sharded state."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlzoo.train_kit import checkpoint as ckpt

if TYPE_CHECKING:
    from rlzoo.backends.megatron.train import MegatronTrainBackend

CHECKPOINT_FORMAT = "rlzoo-megatron-train/1"


def _init_torch_adam_state(optimizer: Any, step: int | None = None) -> None:
    """Give a fresh torch ``Adam`` / ``AdamW`` inside a megatron optimizer its (zero) state; with
    ``step``, set every param's Adam step count to it.

    megatron-core's distributed optimizer, without Apex / Transformer Engine, reads every param's
    ``step`` when it builds the sharded state dict to load into (``DistributedOptimizer.state_dict``),
    and a fresh optimizer has none: this fills in what the load then overwrites. Its
    ``dp_reshardable`` load restores the moments but leaves torch's per-param ``step`` at that
    placeholder, so after a load the step is set from the checkpoint: the number of optimizer
    steps taken (the policy version; a skipped step does not step Adam either).
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if not isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            continue
        for group in inner.param_groups:
            for p in group["params"]:
                state = inner.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)  # torch keeps it on the CPU
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if step is not None:
                    state["step"] = torch.tensor(
                        float(step), dtype=torch.float32, device=state["step"].device
                    )


def ckpt_metadata(backend: MegatronTrainBackend) -> dict[str, Any]:
    """How the distributed optimizer's state is laid out on disk. megatron-core 0.16's default
    ('fully_sharded_model_space', deprecated) is refused by its own ``dist_checkpointing.save``
    ("ShardedTensor.flattened_range is not supported"); 'dp_reshardable' saves each rank's
    buffers in parallel (resume with the same TP / PP, any DP)."""
    return (
        {"distrib_optim_sharding_type": "dp_reshardable"} if backend.params.use_distributed_optimizer else {}
    )


def save_checkpoint(backend: MegatronTrainBackend, path: Path, extra_state: Mapping[str, Any]) -> None:
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    path = Path(path)
    extra = json.loads(json.dumps(dict(extra_state)))
    parts = [("actor", backend.actor_ddp, backend.optimizer)]
    if backend.critic_ddp is not None:
        parts.append(("critic", backend.critic_ddp, backend.critic_optimizer))
    tmp = path.with_name(path.name + ".tmp")
    for name, ddp, opt in parts:
        if backend.params.param_offload:
            backend._onload(ddp)
        sd = ddp.module.sharded_state_dict(prefix="")
        (tmp / name).mkdir(parents=True, exist_ok=True)
        dist.barrier()
        osd = opt.sharded_state_dict(sd, metadata=ckpt_metadata(backend))
        dist_checkpointing.save({"model": sd, "optimizer": osd}, str(tmp / name))
        if backend.params.param_offload:
            backend._offload(ddp)
    if dist.get_rank() == 0:
        meta = {
            "format": CHECKPOINT_FORMAT,
            "version": backend.version,
            "critic_steps": backend.critic_steps,
            "has_critic": backend.critic_ddp is not None,
            "extra_state": extra,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        ckpt.save_tree(ckpt.rng_state(), tmp, "rng")
        (tmp / "COMPLETE").write_text(json.dumps({"format": CHECKPOINT_FORMAT}))
        if path.exists():
            import shutil

            shutil.rmtree(path)
        tmp.rename(path)
    dist.barrier()


def load_checkpoint(backend: MegatronTrainBackend, path: Path) -> dict[str, Any]:
    from megatron.core import dist_checkpointing

    path = Path(path)
    ckpt.require_complete(path)
    meta = json.loads((path / "meta.json").read_text())
    parts = [("actor", backend.actor_ddp, backend.optimizer)]
    if backend.critic_ddp is not None:
        parts.append(("critic", backend.critic_ddp, backend.critic_optimizer))
    steps = {"actor": int(meta["version"]), "critic": int(meta["critic_steps"])}
    for name, ddp, opt in parts:
        if backend.params.param_offload:
            backend._onload(ddp)
        sd = ddp.module.sharded_state_dict(prefix="")
        _init_torch_adam_state(opt)
        # is_loading=True: the optimizer's sharded state dict must be built for loading (it
        # allocates the state to load into); without it Adam's moments are silently not restored.
        osd = opt.sharded_state_dict(sd, is_loading=True, metadata=ckpt_metadata(backend))
        loaded = dist_checkpointing.load({"model": sd, "optimizer": osd}, str(path / name))
        with torch.no_grad():  # fp32 + distributed optimizer: its main params are views of the weights
            ddp.module.load_state_dict(loaded["model"], strict=False)
            opt.load_state_dict(loaded["optimizer"])
        _init_torch_adam_state(opt, step=steps[name])
        if backend.params.param_offload:
            backend._offload(ddp)
    backend.version = int(meta["version"])
    backend.critic_steps = int(meta["critic_steps"])
    ckpt.set_rng_state(ckpt.load_tree(path, "rng"))
    return dict(meta["extra_state"])
