"""The fsdp2 backend's process-group and cross-rank helpers: starting (or joining) the default
group, and joining the ranks in one update (:class:`ProcessGroupRanks`: loss sum, skip verdict,
each rank's metrics and objective accumulator merged).

:func:`ensure_process_group` is re-exported by :mod:`rlzoo.backends.fsdp2.train`.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlzoo.kernel.protocols import AccumulatingObjective, Objective
from rlzoo.train_kit.update import floats

__all__ = ["ProcessGroupRanks", "ensure_process_group", "merge_across_ranks"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_process_group(device_type: str) -> bool:
    """Initialise the default group unless one is; True when this call created it.

    With ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT`` in the environment (torchrun)
    it joins that group (``env://``); otherwise it starts a one-process group on a free port.
    Backend: nccl for CUDA, gloo for CPU.
    """
    if dist.is_initialized():
        return False
    backend = "nccl" if device_type == "cuda" else "gloo"
    if all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(minutes=30))
    else:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    return True


def merge_across_ranks(
    collected: dict[str, list[float]], objective: Objective, mark: Any | None, *, every: int = 1
) -> dict[str, float]:
    """Means of the per-micro-batch metrics over all ranks; merge the objective's accumulator.

    An :class:`~rlzoo.kernel.protocols.AccumulatingObjective` (``mark``: its ``acc.mark()`` from before
    the update) accumulates metrics in ``objective.acc``; each rank saw only its shard, so what
    this update added on every rank is merged into it (``acc.merge``), and ``objective.acc.summary()``
    reads the same on every rank. One ``all_gather_object`` carries both. ``every``: only ranks
    ``0, every, 2 every, ...`` count (with Ulysses the ranks of an SP group saw the same samples).
    """
    acc = objective.acc if isinstance(objective, AccumulatingObjective) and mark is not None else None
    local: dict[str, Any] = {"collected": collected, "acc": None if acc is None else acc.since(mark)}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    gathered = gathered[::every]
    merged: dict[str, list[float]] = {}
    for g in gathered:
        for k, v in g["collected"].items():
            merged.setdefault(k, []).extend(v)
    if acc is not None:
        acc.merge(mark, [g["acc"] for g in gathered])
    return {k: sum(v) / len(v) for k, v in merged.items() if v}


class ProcessGroupRanks:
    """The default group's ranks in one update (:class:`rlzoo.train_kit.update.Ranks`): the loss
    summed over ranks, a step skipped on all ranks when any rank's is not finite, the metrics
    and the objective's accumulator merged (:func:`merge_across_ranks`). ``sp``: the Ulysses group
    size; the ``sp`` ranks of a group compute the same loss and metrics, counted once (its first
    rank's)."""

    def __init__(self, rank: int, world: int, device: torch.device, *, sp: int = 1) -> None:
        self.rank, self.world, self.device, self.sp = rank, world, device, sp

    def sum_loss(self, total: Tensor) -> Tensor:
        if self.rank % self.sp:  # a copy of its SP group's loss
            total = torch.zeros_like(total)
        dist.all_reduce(total)  # sum over ranks
        return total

    def agree(self, bad: bool) -> bool:
        flag = torch.tensor([1.0 if bad else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def mark(self, objective: Objective) -> Any:
        """``objective.acc.mark()`` of an accumulating objective, else None (nothing to merge)."""
        return objective.acc.mark() if isinstance(objective, AccumulatingObjective) else None

    def metrics(self, collected: dict[str, list[Any]], objective: Objective, mark: Any) -> dict[str, float]:
        return merge_across_ranks(floats(collected), objective, mark, every=self.sp)
