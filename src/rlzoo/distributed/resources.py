"""Resource pools: what the ``placement`` section asks for, checked against what the cluster has.

Pure Python (no Ray import at module level), so the arithmetic is testable without a cluster.

A pool is ``nnodes`` nodes; on each node either ``n_gpus_per_node`` GPU workers (one actor per GPU)
or, when ``n_gpus_per_node == 0``, ``n_workers_per_node`` CPU workers. Every worker is one Ray
actor in one placement-group bundle: ``{"GPU": 1, "CPU": 1}`` or ``{"CPU": 1}``.

``colocate=true``: one pool (``placement.trainer``) hosts training and rollout (``placement.rollout``
is ignored). ``colocate=false`` (split): the trainer and rollout pools must fit side by side; pools
that can only be satisfied by sharing devices are "overlapping" and refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlzoo.kernel.errors import ConfigError

__all__ = ["PoolPlan", "check_pools", "plan_pools"]


@dataclass(frozen=True)
class PoolPlan:
    """One resource pool: ``nnodes`` x (``gpus_per_node`` GPU workers | ``workers_per_node`` CPU workers)."""

    name: str  # "trainer" | "rollout"
    key: str  # config key path, for messages ("placement.trainer")
    nnodes: int
    gpus_per_node: int
    workers_per_node: int
    threads: int | None = None  # torch CPU threads per worker process (None: the worker's own default)

    @property
    def uses_gpu(self) -> bool:
        return self.gpus_per_node > 0

    @property
    def per_node(self) -> int:
        """Workers (actors, bundles) on each node."""
        return self.gpus_per_node if self.uses_gpu else self.workers_per_node

    @property
    def world_size(self) -> int:
        return self.nnodes * self.per_node

    @property
    def bundle(self) -> dict[str, float]:
        """The resources of one worker."""
        return {"CPU": 1.0, "GPU": 1.0} if self.uses_gpu else {"CPU": 1.0}

    def totals(self) -> dict[str, float]:
        return {k: v * self.world_size for k, v in self.bundle.items()}

    def describe(self) -> str:
        if self.uses_gpu:
            return (
                f"{self.key}: {self.nnodes} node(s) x {self.gpus_per_node} GPU(s) = {self.world_size} GPU(s)"
            )
        return f"{self.key}: {self.nnodes} node(s) x {self.workers_per_node} CPU worker(s) = {self.world_size} CPU(s)"


def plan_pools(placement: Any) -> list[PoolPlan]:
    """The pools of a ``PlacementSection``: ``[trainer]`` when colocated, else ``[trainer, rollout]``."""
    problems: list[str] = []
    pools: list[PoolPlan] = []
    names = ("trainer",) if placement.colocate else ("trainer", "rollout")
    for name in names:
        sec = getattr(placement, name)
        key = f"placement.{name}"
        for field_name in ("nnodes", "n_gpus_per_node", "n_workers_per_node"):
            value = getattr(sec, field_name)
            low = 0 if field_name == "n_gpus_per_node" else 1
            if not isinstance(value, int) or value < low:
                problems.append(f"{key}.{field_name} must be an integer >= {low}, got {value!r}")
        threads = getattr(sec, "threads", None)
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            problems.append(
                f"{key}.threads must be an integer >= 1 or null (the worker's default), got {threads!r}"
            )
        if not problems:
            pools.append(
                PoolPlan(name, key, sec.nnodes, sec.n_gpus_per_node, sec.n_workers_per_node, threads)
            )
    if problems:
        raise ConfigError(problems, header="invalid placement")
    return pools


def _fmt(res: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(res.items())) or "nothing"


def check_pools(
    pools: Sequence[PoolPlan],
    available: Mapping[str, float],
    nodes: Sequence[Mapping[str, float]] | None = None,
    *,
    colocate: bool,
) -> None:
    """Raise :class:`ConfigError` when ``pools`` cannot be placed on a cluster with ``available`` resources.

    ``available`` is ``ray.cluster_resources()``; ``nodes`` the per-node resources of the alive nodes
    (for the per-node checks of GPU pools; skipped when None). All problems are reported together,
    each naming what was asked for and what the cluster has.
    """
    problems: list[str] = []
    have = {k: float(available.get(k, 0.0)) for k in ("CPU", "GPU")}
    cluster = f"the cluster has {_fmt(have)}"
    for p in pools:
        for res, need in p.totals().items():
            if need > have[res]:
                problems.append(f"{p.describe()} asks for {res}={need:g} but {cluster}")
        if nodes is not None and p.uses_gpu:
            fit = sum(1 for n in nodes if float(n.get("GPU", 0.0)) >= p.gpus_per_node)
            if fit < p.nnodes:
                per_node = sorted((float(n.get("GPU", 0.0)) for n in nodes), reverse=True)
                problems.append(
                    f"{p.describe()} needs {p.nnodes} node(s) with >= {p.gpus_per_node} GPU(s) each, "
                    f"but only {fit} node(s) have that (GPUs per node: {per_node})"
                )
    if not colocate and len(pools) > 1 and not problems:
        total: dict[str, float] = {}
        for p in pools:
            for res, need in p.totals().items():
                total[res] = total.get(res, 0.0) + need
        over = {res: need for res, need in total.items() if need > have[res]}
        if over:
            asked = " + ".join(p.describe() for p in pools)
            problems.append(
                f"split placement (placement.colocate=false): the pools overlap: {asked} asks for "
                f"{_fmt(total)} in total but {cluster}; each pool fits alone, not side by side. "
                "Shrink a pool or set placement.colocate=true"
            )
        elif nodes is not None and any(p.uses_gpu for p in pools) and not _pack_nodes(pools, nodes):
            problems.append(
                "split placement (placement.colocate=false): the pools overlap: "
                + " + ".join(p.describe() for p in pools)
                + f" cannot be packed side by side onto the nodes' GPUs "
                f"({[float(n.get('GPU', 0.0)) for n in nodes]}). Shrink a pool or set placement.colocate=true"
            )
    if problems:
        raise ConfigError(problems, header="placement does not fit the Ray cluster")


def _pack_nodes(pools: Sequence[PoolPlan], nodes: Sequence[Mapping[str, float]]) -> bool:
    """Greedy check that every pool's per-node GPU groups fit the nodes' free GPUs together."""
    free = sorted((float(n.get("GPU", 0.0)) for n in nodes), reverse=True)
    groups = sorted((p.gpus_per_node for p in pools if p.uses_gpu for _ in range(p.nnodes)), reverse=True)
    for g in groups:
        for i, f in enumerate(free):
            if f >= g:
                free[i] -= g
                break
        else:
            return False
        free.sort(reverse=True)
    return True
