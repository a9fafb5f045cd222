"""Process group, megatron's model-parallel state and RNG seeding for :mod:`.train`, this rank's
place in the TP × PP × DP grid (:class:`Layout`), and the module-level record of what this
process's backends set up themselves (and so tear down)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from rlzoo.kernel.errors import import_optional

#: what the backends of this process set up themselves (and so tear down when the last one shuts
#: down): the process group, megatron's model-parallel state, and how many backends use them
_OWNED: dict[str, Any] = {"group": False, "model_parallel": False, "users": 0}


@dataclass(frozen=True)
class Layout:
    """This rank's place in the ``tp × pp × dp`` world: each size and this rank's index in it; ``ep``
    / ``ep_rank``: the expert-parallel group the MoE experts are split over (a split of the
    ``tp × dp`` ranks of one stage; 1 / 0 for a dense model); ``etp`` / ``etp_rank``: the expert
    tensor-parallel group each expert's matrices are split over."""

    tp: int
    tp_rank: int
    pp: int
    pp_rank: int
    dp: int
    dp_rank: int
    ep: int = 1
    ep_rank: int = 0
    etp: int = 1
    etp_rank: int = 0


def world_size() -> int:
    """The world this process is in or will join: the started group's, else the launcher's
    ``WORLD_SIZE``, else 1 (the one-process group :func:`_init_distributed` starts)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return int(dist.get_world_size())
    return int(os.environ.get("WORLD_SIZE", "1")) if "RANK" in os.environ else 1


def _init_distributed(device: str) -> None:
    """A process group of the device's kind: NCCL on ``cuda`` (one GPU per rank), gloo on ``cpu``.

    Joins ``torchrun``'s world (``RANK`` / ``WORLD_SIZE`` set) or starts a one-process group.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            # the launcher's world (torchrun): it outlives any backend; never torn down here (a
            # second init over the launcher's store after a teardown would wait forever)
            dist.init_process_group(backend, init_method="env://")
        else:
            _OWNED["group"] = True
            from rlzoo.distributed.weight_sync import free_port

            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
            )
    if device == "cuda":
        torch.cuda.set_device(
            int(os.environ.get("LOCAL_RANK", dist.get_rank() % max(1, torch.cuda.device_count())))
        )


def _seed(seed: int, device: str) -> None:
    """Megatron's RNG tracker. On CPU there is no CUDA generator to fork: the no-op tracker is used
    (its ``fork()`` is a null context), which is exact here because every dropout is 0 and the
    weights are loaded from the checkpoint, never initialised at random."""
    from megatron.core import tensor_parallel

    torch.manual_seed(seed)
    if device == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
    else:
        from megatron.core.tensor_parallel.random import initialize_rng_tracker

        initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


def _require_psutil() -> None:
    """megatron-core's checkpoint writer imports psutil in a worker; without it a save hangs."""
    import_optional(
        "psutil",
        "the 'megatron' train backend needs psutil (megatron-core's dist_checkpointing writer hangs "
        "without it): pip install 'rlzoo[megatron]' or pip install psutil",
        ImportError,
    )


def check_expert_parallel(
    ep: int, etp: int, *, tp: int, pp: int, world: int, num_experts: int, sequence_parallel: bool = False
) -> None:
    """A clear error, before megatron builds anything, when the expert layout does not fit the model
    or the world.

    megatron splits the ``world / pp`` ranks of a stage into ``tp × dp`` for attention and into
    ``etp × ep × (expert data parallel)`` for the experts: ``ep × etp`` must divide ``world / pp``,
    and ``ep`` the expert count. A MoE model under TP > 1 needs sequence parallelism (megatron-core
    refuses to train its MoE layer otherwise, at the first update)."""
    problems = []
    if not num_experts:
        if ep != 1 or etp != tp:
            problems.append(
                f"expert_parallel_size {ep} / expert_tensor_parallel_size {etp} need a MoE model; this one "
                "has no experts: leave them at 1 / null"
            )
    else:
        if num_experts % ep:
            problems.append(
                f"expert_parallel_size {ep} does not divide the model's {num_experts} experts: use a divisor "
                f"of {num_experts}"
            )
        if tp > 1 and not sequence_parallel:
            problems.append(
                f"a MoE model with tensor_model_parallel_size {tp} needs sequence_parallel (megatron-core "
                "refuses to train its MoE layer under TP without it), and that needs layer_spec 'te'; "
                "on CPU use tensor_model_parallel_size 1 (and expert_parallel_size for the experts)"
            )
    if world % pp or (world // pp) % (ep * etp):
        problems.append(
            f"expert_parallel_size {ep} × expert_tensor_parallel_size {etp} does not divide the {world} "
            f"ranks / pipeline {pp}: the experts of a stage are split over its ranks"
        )
    if problems:
        raise ValueError("megatron train backend: " + "; ".join(problems))


def claim_owned(mpu: Any, tp: int, pp: int, ep: int = 1, etp: int | None = None) -> None:
    """Initialise megatron's model-parallel state unless present (then owned here); count a user.

    State present with other sizes is set up again when no backend of this process uses it (a
    launcher's world keeps it after the last one shut down), and an error while one does."""
    sizes = (tp, pp, ep, tp if etp is None else etp)
    if mpu.model_parallel_is_initialized():
        have = (
            mpu.get_tensor_model_parallel_world_size(),
            mpu.get_pipeline_model_parallel_world_size(),
            mpu.get_expert_model_parallel_world_size(),
            mpu.get_expert_tensor_parallel_world_size(),
        )
        if have != sizes and _OWNED["users"] > 0:
            raise ValueError(
                f"megatron's model-parallel state (tensor, pipeline, expert, expert tensor) = {have} is in use by another "
                f"backend of this process; this one asks for {sizes}"
            )
        if have != sizes:
            mpu.destroy_model_parallel()
    if not mpu.model_parallel_is_initialized():
        mpu.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
        )
        _OWNED["model_parallel"] = True
    _OWNED["users"] += 1


def release_owned(mpu: Any) -> None:
    """One user fewer; the last one out tears down what the backends set up, when that was a
    one-process group of their own (in a launcher's world the state stays for the next backend)."""
    _OWNED["users"] -= 1
    if _OWNED["users"] == 0 and _OWNED["group"]:
        import torch.distributed as dist

        if _OWNED["model_parallel"]:
            mpu.destroy_model_parallel()
            _OWNED["model_parallel"] = False
        if _OWNED["group"] and dist.is_initialized():
            dist.destroy_process_group()
            _OWNED["group"] = False
