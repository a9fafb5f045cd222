"""The fsdp2 train backend plugin: params + registration. Import-light (no torch here).

The implementation lives in :mod:`rlzoo.backends.fsdp2.train`; see ``docs/backends/fsdp2.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rlzoo import hookimpl
from rlzoo.kernel.params import check_ranges, param
from rlzoo.train_kit.params import HFTrainParams

if TYPE_CHECKING:
    from rlzoo.kernel.registry import PartFactory, Registrar

__all__ = ["FSDP2Params", "ulysses_problems"]

# what the hook at the end registers: the implementation (imported on first use), its capabilities
_TRAIN = "rlzoo.backends.fsdp2.train:FSDP2TrainBackend"
_CAPABILITIES = {
    "distributed": True,
    "devices": ["cpu", "cuda"],
    "supports_critic": True,
    "supplies_sum_pi_squared": True,
    "supports_lora": True,
    "supports_teacher": True,
}


@dataclass(frozen=True)
class FSDP2Params(HFTrainParams):
    """Data-parallel PyTorch FSDP2 trainer (fully_shard): sharded actor, critic and reference, SPMD.

    Runs in every rank of a torch.distributed group (it starts a one-process group itself when none
    is initialised: gloo on CPU, nccl on CUDA). Every rank is called with the same full mini-batch
    and trains on its own shard, chosen by balancing real-token counts across ranks; results of
    ``compute_log_probs`` / ``compute_values`` are all-gathered back into the original order on every
    rank. Each decoder layer and then the root module is ``fully_shard``-ed over a device mesh of
    ``fsdp_size`` ranks (several meshes replicate: HSDP). Gradients are **summed** over micro-batches
    and ranks (the objective divides by the mini-batch's global counts; FSDP2's default mean is turned
    off with ``set_gradient_divide_factor(1.0)``). Optional bf16 mixed precision (CUDA), CPU offload
    of params / grads / optimizer step, activation checkpointing, padding-free (packed) forwards,
    a critic (value head) and a param-offloaded frozen reference. Checkpoints are sharded
    ``torch.distributed.checkpoint`` directories written atomically; ``export_hf`` gathers a full
    HF safetensors model on rank 0.

    The fields every HF trainer shares come from :class:`~rlzoo.train_kit.params.HFTrainParams`
    (as the native backend's do); the optimizer, LR schedule and micro-batch sizes
    are the trainer's (``trainer.optim``, ``trainer.micro_batch``; micro-batches are per rank).
    ``dtype`` is the dtype of the stored (master) weights and optimizer state.
    """

    fsdp_size: int = param(
        -1, help="ranks one model is sharded over; -1: the whole world; a divisor of it gives HSDP replicas"
    )
    mixed_precision: bool = param(
        True, help="on CUDA: compute in bf16 (param_dtype), reduce gradients in fp32; ignored on CPU"
    )
    offload: bool = param(
        False,
        help="keep the actor's and critic's params, grads and optimizer step on the CPU (CPUOffloadPolicy)",
    )
    ref_offload: bool = param(
        True, help="keep the frozen reference model's params on the CPU between forwards"
    )
    use_remove_padding: bool = param(
        True,
        help="padding-free forward: pack a micro-batch's real tokens into one row, position_ids restarting "
        "per sequence (needs an attention implementation that honours packed position_ids: sdpa, eager, "
        "flash_attention_2 in transformers >= 5); on sdpa (llama, mistral, qwen2/3 families) each "
        "sequence's attention runs on its own and a group's samples share one copy of their prompt",
    )
    reshard_after_forward: bool = param(
        True, help="free gathered params after each layer's forward (ZeRO-3); False keeps them until backward"
    )
    ulysses_size: int = param(
        1,
        ge=1,
        help="Ulysses sequence parallelism: ranks one packed sequence is split over (1: off); must divide "
        "the world size and the model's attention and KV heads; needs use_remove_padding",
    )

    kind: ClassVar[str] = "fsdp2"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fsdp_size == 0 or self.fsdp_size < -1:
            raise ValueError(
                f"invalid fsdp2 train params: fsdp_size must be -1 or >= 1, got {self.fsdp_size}"
            )
        ranges = check_ranges(self)
        if ranges:
            raise ValueError(f"invalid fsdp2 train params: {'; '.join(ranges)}")
        if self.sequence_parallel and not self.use_remove_padding:
            raise ValueError(
                f"invalid fsdp2 train params: ulysses_size={self.ulysses_size} splits the packed row of a "
                "padding-free forward; set use_remove_padding: true (or ulysses_size: 1)"
            )

    @property
    def sequence_parallel(self) -> bool:
        """Whether sequences are split over ranks (``ulysses_size`` above 1)."""
        return self.ulysses_size > 1

    def check(self, cfg: Any) -> list[str]:
        """Ulysses against the trainer's world size (the Ray trainer pool; one process with
        ``placement.name=local``) and the heads of the actor's / critic's ``config.json`` when the
        model is a local folder (otherwise the backend checks them when it loads the model)."""
        if not self.sequence_parallel:
            return []
        placement = cfg.placement
        if placement.name == "ray":
            pool = placement.trainer
            world = pool.nnodes * (pool.n_gpus_per_node or pool.n_workers_per_node)
            where = "the trainer pool (placement.trainer)"
        else:
            world, where = 1, "placement.name=local (one trainer process)"
        problems = ulysses_problems(self.ulysses_size, world, where=where)
        for key in ("path", "critic_path"):
            heads = _local_heads(getattr(cfg.model, key, None))
            if heads is not None:
                problems += ulysses_problems(self.ulysses_size, None, heads=heads, where=f"model.{key}")
        return [f"trainer.backend.ulysses_size: {p}" for p in problems]


def ulysses_problems(
    size: int, world: int | None, *, heads: tuple[int, int] | None = None, where: str = ""
) -> list[str]:
    """Why ``ulysses_size=size`` cannot run: it must divide ``world`` (the ranks, when given) and
    the model's attention and KV heads ``heads`` (each rank attends with ``heads / size`` of them
    over the whole sequence). One sentence per problem, naming both numbers."""
    out: list[str] = []
    at = f" ({where})" if where else ""
    if world is not None and world % size:
        out.append(f"{size} does not divide the world size {world}{at}; use a divisor of {world}")
    if heads is not None:
        for what, n in zip(("attention heads", "KV heads"), heads, strict=True):
            if n % size:
                out.append(f"{size} does not divide the model's {n} {what}{at}; use a divisor of {n}")
    return out


def _local_heads(path: str | None) -> tuple[int, int] | None:
    """``(num_attention_heads, num_key_value_heads)`` of a local model folder's ``config.json``
    (a text model's, or its ``text_config``'s), None when there is none to read here."""
    if not path or not (Path(path) / "config.json").is_file():
        return None
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg) if "num_attention_heads" not in cfg else cfg
    if not isinstance(cfg.get("num_attention_heads"), int):
        return None
    heads = int(cfg["num_attention_heads"])
    return heads, int(cfg.get("num_key_value_heads") or heads)


@hookimpl
def rlzoo_register_train_backends(registry: Registrar[PartFactory]) -> None:
    registry.register("fsdp2", _TRAIN, params=FSDP2Params, capabilities=_CAPABILITIES)
