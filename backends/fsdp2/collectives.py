"""The fsdp2 backend's process-group and cross-rank helpers: starting (or joining) the default
group, and merging each rank's metrics and objective accumulator after an update.

:func:`ensure_process_group` is re-exported by :mod:`rlzoo.backends.fsdp2.train`.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch.distributed as dist

__all__ = ["acc_snapshot", "ensure_process_group", "merge_across_ranks"]


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


def acc_snapshot(objective: Any) -> tuple[dict[str, float], dict[str, int]] | None:
    """What the objective's accumulator held before this update (None: it has none)."""
    acc = getattr(objective, "acc", None)
    if acc is None or not hasattr(acc, "sums") or not hasattr(acc, "means"):
        return None
    return dict(acc.sums), {k: len(v) for k, v in acc.means.items()}


def merge_across_ranks(
    collected: dict[str, list[float]],
    objective: Any,
    snapshot: tuple[dict[str, float], dict[str, int]] | None,
) -> dict[str, float]:
    """Means of the per-micro-batch metrics over all ranks; merge the objective's accumulator.

    :class:`rlzoo.train.objective.PolicyObjective` accumulates additive sums (already globally
    normalised) and per-micro-batch means in ``objective.acc``; each rank saw only its shard, so
    what this update added is summed (sums) or concatenated (means) over ranks, in place, so that
    ``objective.summary()`` reads the same on every rank.
    """
    local: dict[str, Any] = {"collected": collected}
    acc: Any = getattr(objective, "acc", None)
    if snapshot is not None:
        sums0, lens0 = snapshot
        local["sums"] = {k: v - sums0.get(k, 0.0) for k, v in acc.sums.items()}
        local["means"] = {k: list(v[lens0.get(k, 0) :]) for k, v in acc.means.items()}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    merged: dict[str, list[float]] = {}
    for g in gathered:
        for k, v in g["collected"].items():
            merged.setdefault(k, []).extend(v)
    if snapshot is not None:
        sums0, lens0 = snapshot
        for k in list(acc.sums):
            acc.sums[k] = sums0.get(k, 0.0)
        for k in list(acc.means):
            del acc.means[k][lens0.get(k, 0) :]
        for g in gathered:
            for k, v in g["sums"].items():
                acc.sums[k] += v
            for k, v in g["means"].items():
                acc.means[k].extend(v)
    return {k: sum(v) / len(v) for k, v in merged.items() if v}
