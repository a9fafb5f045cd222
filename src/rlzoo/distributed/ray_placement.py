"""``placement.name=ray``: backends as Ray actors on resource pools.

Same interface as :class:`rlzoo.placement.LocalPlacement`: ``train_backend(sel, spec)``,
``rollout_backend(sel, spec)``, ``shutdown()``. The returned proxies
(:class:`~rlzoo.distributed.worker_group.TrainGroup`,
:class:`~rlzoo.distributed.worker_group.RolloutGroup`) expose the backend protocols, so runner code
does not change; ``Session.sync_weights()`` turns into a bucketed broadcast between actors.

Order, so that a placement that cannot fit fails before any actor starts:

1. the pools are read from ``placement.trainer`` / ``placement.rollout`` and checked
   (:mod:`rlzoo.distributed.resources`);
2. Ray is joined (``placement.address``) or reused (already initialised) or started locally;
3. the pools are checked against ``ray.cluster_resources()``; a shortfall or, in split mode,
   overlapping pools raise :class:`~rlzoo.kernel.errors.ConfigError` naming what was asked and what exists;
4. placement groups are reserved (one per pool node, ``STRICT_PACK``) and waited on;
5. workers start when a backend is asked for.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from rlzoo.distributed.resources import PoolPlan, check_pools, plan_pools
from rlzoo.distributed.worker_group import RolloutGroup, TrainGroup, WorkerSet
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.settings import RolloutSpec, TrainSpec
from rlzoo.recipe.types import PlacementSection, Selection

__all__ = ["RayPlacement", "init_ray"]

logger = logging.getLogger("rlzoo.distributed")

#: Ray's setting of its workers' niceness (read when a local cluster starts)
WORKER_NICENESS = "RAY_worker_niceness"

#: seconds to wait for a placement group before reporting that the cluster cannot host it
PG_READY_TIMEOUT_S = 120.0


def init_ray(address: str | None) -> bool:
    """Join ``address``, reuse a running Ray, or start a local one. Returns True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=True)
    else:
        # a local, CPU-only by default single-node cluster; Ray counts the cores and GPUs itself. Its
        # workers are this run's compute (the trainer, the engine), so they start at the driver's
        # priority, not Ray's default nice 15 (Ray's job manager does the same for a submitted job):
        # at nice 15 they lose every contest for the cores on a shared machine. RAY_worker_niceness
        # set by the user wins.
        saved = os.environ.get(WORKER_NICENESS)
        os.environ[WORKER_NICENESS] = saved if saved is not None else "0"
        try:
            ray.init(include_dashboard=False, ignore_reinit_error=True, log_to_driver=True)
        finally:
            if saved is None:
                del os.environ[WORKER_NICENESS]
    return True


def _target(sel: Selection) -> Any:
    """What a worker needs to build the part: the lazy ``module:attr`` string (picklable)."""
    target = sel.component.target
    return target  # a string, or an object registered directly (shipped by cloudpickle)


class RayPlacement:
    """Backends on Ray actors. See the module docstring and ``docs/distributed.md``."""

    name = "ray"

    def __init__(self, pc: PlacementSection) -> None:
        import ray

        self.colocate = bool(pc.colocate)
        self.pools: dict[str, PoolPlan] = {p.name: p for p in plan_pools(pc)}
        self.bucket_size_mb = float(pc.bucket_size_mb)
        self.sync_timeout_s = float(pc.sync_timeout_s)
        self._started = init_ray(pc.address)
        try:
            nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
            check_pools(list(self.pools.values()), ray.cluster_resources(), nodes, colocate=self.colocate)
        except BaseException:
            self._stop_ray()
            raise
        self._pgs: dict[str, list[Any]] = {}
        self._workers: dict[str, WorkerSet] = {}
        self._train: TrainGroup | None = None
        self._rollout: RolloutGroup | None = None
        try:
            for p in self.pools.values():
                self._pgs[p.name] = self._reserve(p)
        except BaseException:
            self.shutdown()
            raise

    # -- resources ------------------------------------------------------------------------------
    def _reserve(self, pool: PoolPlan) -> list[Any]:
        import ray
        from ray.util.placement_group import placement_group

        pgs = [
            placement_group([dict(pool.bundle) for _ in range(pool.per_node)], strategy="STRICT_PACK")
            for _ in range(pool.nnodes)
        ]
        ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=PG_READY_TIMEOUT_S)
        if len(ready) < len(pgs):
            raise ConfigError(
                [
                    f"{pool.describe()}: the Ray cluster could not reserve it within {PG_READY_TIMEOUT_S:.0f} s "
                    f"(cluster has {ray.cluster_resources()}, free {ray.available_resources()})"
                ],
                header="placement does not fit the Ray cluster",
            )
        return pgs

    def _bundles(self, pool: str) -> list[tuple[Any, int, dict[str, float]]]:
        plan = self.pools[pool]
        return [(pg, i, plan.bundle) for pg in self._pgs[pool] for i in range(plan.per_node)]

    def workers(self, pool: str) -> WorkerSet:
        """The worker actors of ``pool`` (started on first use)."""
        if pool not in self._workers:
            plan = self.pools[pool]
            ws = WorkerSet(pool, plan.world_size, self._bundles(pool))
            self._workers[pool] = ws
            if plan.threads is not None:
                ws.wait([a.set_threads.remote(plan.threads) for a in ws.actors], "set torch threads")
        return self._workers[pool]

    # -- the placement interface ----------------------------------------------------------------
    def train_backend(self, sel: Selection, spec: TrainSpec) -> TrainGroup:
        ws = self.workers("trainer")
        ws.wait(
            [a.build.remote(TrainGroup.role, _target(sel), sel.params, spec) for a in ws.actors],
            "build train backend",
        )
        self._train = TrainGroup(ws)
        if self._rollout is not None and self._rollout.train is None:
            self._rollout.train = self._train
        return self._train

    def rollout_backend(self, sel: Selection, spec: RolloutSpec) -> RolloutGroup:
        ws = self.workers("trainer" if self.colocate else "rollout")
        ws.wait(
            [a.build.remote(RolloutGroup.role, _target(sel), sel.params, spec) for a in ws.actors],
            "build rollout backend",
        )
        self._rollout = RolloutGroup(
            ws,
            train=self._train,
            colocated=self.colocate,
            bucket_size_mb=self.bucket_size_mb,
            sync_timeout_s=self.sync_timeout_s,
        )
        return self._rollout

    def shutdown(self) -> None:
        """Kill the workers, free the placement groups, and stop Ray if this placement started it."""
        from ray.util.placement_group import remove_placement_group

        for ws in self._workers.values():
            ws.kill()
        self._workers.clear()
        for pgs in self._pgs.values():
            for pg in pgs:
                with contextlib.suppress(Exception):  # already gone with the cluster
                    remove_placement_group(pg)
        self._pgs.clear()
        self._stop_ray()

    def _stop_ray(self) -> None:
        if self._started and not os.environ.get("RLZOO_KEEP_RAY"):
            import ray

            ray.shutdown()
            self._started = False
