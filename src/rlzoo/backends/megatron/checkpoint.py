"""Checkpoints of the megatron train backend: megatron ``dist_checkpointing`` (every rank writes
its shards) with the optimizers' sharded state, and the step counters in ``meta.json``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from rlzoo.backends.megatron.offload import Offloader
from rlzoo.train_kit import checkpoint as ckpt

__all__ = ["CHECKPOINT_FORMAT", "Steps", "Trained", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_FORMAT = "rlzoo-megatron-train/1"


@dataclass(frozen=True)
class Trained:
    """A model a checkpoint holds with its optimizer: ``name`` is its folder ('actor', 'critic')."""

    name: str
    ddp: Any  # megatron's DistributedDataParallel around the GPTModel
    optimizer: Any  # the megatron optimizer of ``ddp``


class Steps(NamedTuple):
    """The optimizer steps taken (skipped steps not counted): the actor's (the policy version) and
    the critic's."""

    version: int
    critic_steps: int


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


def ckpt_metadata(distributed_optimizer: bool) -> dict[str, Any]:
    """How the distributed optimizer's state is laid out on disk. megatron-core 0.16's default
    ('fully_sharded_model_space', deprecated) is refused by its own ``dist_checkpointing.save``
    ("ShardedTensor.flattened_range is not supported"); 'dp_reshardable' saves each rank's
    buffers in parallel (resume with the same TP / PP, any DP)."""
    return {"distrib_optim_sharding_type": "dp_reshardable"} if distributed_optimizer else {}


def save_checkpoint(
    path: Path,
    extra_state: Mapping[str, Any],
    models: Sequence[Trained],
    steps: Steps,
    *,
    offloader: Offloader,
    distributed_optimizer: bool,
) -> None:
    """Write ``models`` (each on the device while it is saved), ``steps`` and ``extra_state`` (JSON)
    to ``path``. Collective: every rank writes its shards, rank 0 the rest, then renames the folder."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    path = Path(path)
    extra = json.loads(json.dumps(dict(extra_state)))
    tmp = path.with_name(path.name + ".tmp")
    for model in models:
        with offloader.resident(model.ddp):
            sd = model.ddp.module.sharded_state_dict(prefix="")
            (tmp / model.name).mkdir(parents=True, exist_ok=True)
            dist.barrier()
            osd = model.optimizer.sharded_state_dict(sd, metadata=ckpt_metadata(distributed_optimizer))
            dist_checkpointing.save({"model": sd, "optimizer": osd}, str(tmp / model.name))
    if dist.get_rank() == 0:
        meta = {
            "format": CHECKPOINT_FORMAT,
            "version": steps.version,
            "critic_steps": steps.critic_steps,
            "has_critic": any(model.name == "critic" for model in models),
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


def load_checkpoint(
    path: Path, models: Sequence[Trained], *, offloader: Offloader, distributed_optimizer: bool
) -> tuple[Steps, dict[str, Any]]:
    """Load ``models`` and their optimizers in place from ``path`` and restore the RNG state;
    returns the saved step counters and extra state."""
    from megatron.core import dist_checkpointing

    path = Path(path)
    ckpt.require_complete(path)
    meta = json.loads((path / "meta.json").read_text())
    saved = Steps(version=int(meta["version"]), critic_steps=int(meta["critic_steps"]))
    adam_steps = {"actor": saved.version, "critic": saved.critic_steps}
    for model in models:
        ddp, opt = model.ddp, model.optimizer
        with offloader.resident(ddp):
            sd = ddp.module.sharded_state_dict(prefix="")
            _init_torch_adam_state(opt)
            # is_loading=True: the optimizer's sharded state dict must be built for loading (it
            # allocates the state to load into); without it Adam's moments are silently not restored.
            osd = opt.sharded_state_dict(sd, is_loading=True, metadata=ckpt_metadata(distributed_optimizer))
            loaded = dist_checkpointing.load({"model": sd, "optimizer": osd}, str(path / model.name))
            with torch.no_grad():  # fp32 + distributed optimizer: its main params are views of the weights
                ddp.module.load_state_dict(loaded["model"], strict=False)
                opt.load_state_dict(loaded["optimizer"])
            _init_torch_adam_state(opt, step=adam_steps[model.name])
    ckpt.set_rng_state(ckpt.load_tree(path, "rng"))
    return saved, dict(meta["extra_state"])
