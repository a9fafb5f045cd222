"""Worker groups: Ray actors that host backends, and the driver-side proxies runners talk to.

:class:`BackendWorker` (one Ray actor per GPU / CPU worker, defined in :mod:`rlzoo.distributed.worker`
and re-exported here) hosts backends by *role* (``"train"``, ``"rollout"``; colocated workers host
both). It builds a backend from ``(target, params, spec)`` (``target`` is the registry's lazy
``"module:attr"`` string, imported in the worker) after the torch.distributed environment
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) is set.

Proxies (what :class:`~rlzoo.distributed.ray_placement.RayPlacement` hands to runners):

- :class:`TrainGroup` satisfies :class:`~rlzoo.kernel.protocols.TrainBackend`. SPMD: every method is
  called on every rank with the same arguments (the batch is put in the object store once) and
  rank 0's result is returned. ``version`` is rank 0's. ``export_weights()`` returns a lazy
  :class:`WeightHandle` (see :mod:`rlzoo.distributed.weight_sync` and ``docs/distributed.md``).
  Other methods a backend has (``offload``, ``export_hf``, ...) are forwarded the same way.
- :class:`RolloutGroup` satisfies :class:`~rlzoo.kernel.protocols.RolloutBackend` over one or more
  replicas (one per worker): ``generate`` splits the requests into contiguous chunks and
  concatenates the results (request order is kept); ``submit`` spreads requests over replicas;
  ``stream`` merges the replicas' streams; ``pause`` / ``resume`` / ``abort`` go to all replicas;
  ``update_weights(handle, version)`` runs the bucketed broadcast.

Failures: every wait is fail-fast. When any worker's call raises or its actor dies, the proxy
raises :class:`WorkerError` at once, naming the group, rank, method and carrying the worker's
traceback (the Ray error is chained as ``__cause__``); the group is then marked broken and later
calls raise immediately instead of waiting on peers stuck in a collective.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rlzoo.distributed.worker import BackendWorker
from rlzoo.kernel.errors import RlzooError

__all__ = ["RolloutGroup", "TrainGroup", "WeightHandle", "WorkerError", "WorkerSet"]

logger = logging.getLogger("rlzoo.distributed")

#: seconds a replica's ``stream_poll`` waits for a sample before reporting back (bounds every wait)
POLL_S = 0.25


class WorkerError(RlzooError, RuntimeError):
    """A Ray worker failed or died during a call; the message carries the worker's own error."""


# ---------------------------------------------------------------------------------------------
# a set of actors
# ---------------------------------------------------------------------------------------------
class WorkerSet:
    """``world_size`` :class:`BackendWorker` actors, one per placement-group bundle.

    ``bundles``: ``[(placement_group, bundle_index, resources)]``; None schedules without a
    placement group (tests). GPU workers see the GPUs of the set's workers on their node, ordered
    by local rank, so ``cuda:LOCAL_RANK`` is the worker's own GPU.
    """

    def __init__(
        self,
        name: str,
        world_size: int,
        bundles: Sequence[tuple[Any, int, dict[str, float]]] | None = None,
        *,
        max_concurrency: int = 4,
        env: dict[str, str] | None = None,
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.name = name
        self.broken: str | None = None
        cls = ray.remote(BackendWorker)
        self.actors: list[Any] = []
        for rank in range(world_size):
            opts: dict[str, Any] = {"max_concurrency": max_concurrency}
            if bundles is not None:
                pg, idx, res = bundles[rank]
                opts["num_cpus"] = res.get("CPU", 1.0)
                opts["num_gpus"] = res.get("GPU", 0.0)
                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=idx
                )
            else:
                opts["num_cpus"] = 1
            if env:
                opts["runtime_env"] = {"env_vars": dict(env)}
            self.actors.append(cls.options(**opts).remote(name, rank))  # type: ignore[attr-defined]
        infos = self.wait([a.info.remote() for a in self.actors], "start")
        self.infos = infos
        master = infos[0]
        by_node: dict[str, list[int]] = {}
        for rank, inf in enumerate(infos):
            by_node.setdefault(inf["node_id"], []).append(rank)
        envs = []
        for rank, inf in enumerate(infos):
            peers = by_node[inf["node_id"]]
            e = {
                "MASTER_ADDR": str(master["ip"]),
                "MASTER_PORT": str(master["port"]),
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(peers.index(rank)),
                "LOCAL_WORLD_SIZE": str(len(peers)),
            }
            gpus = [g for p in peers for g in infos[p]["gpu_ids"]]
            if gpus:
                e["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            envs.append(e)
        self.wait([a.set_env.remote(e) for a, e in zip(self.actors, envs)], "set_env")

    @property
    def world_size(self) -> int:
        return len(self.actors)

    def _check(self) -> None:
        if self.broken:
            raise WorkerError(f"{self.name} worker group is unusable after an earlier failure: {self.broken}")

    def wait(
        self, refs: Sequence[Any], what: str, owners: Sequence[tuple[str, int]] | None = None
    ) -> list[Any]:
        """``ray.get`` of ``refs`` that raises as soon as any one fails (never waits on the rest)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        owners = owners or [(self.name, i) for i in range(len(refs))]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                i = index[ref]
                try:
                    results[i] = ray.get(ref, timeout=0)
                except (RayActorError, RayTaskError, GetTimeoutError, ray.exceptions.RayError) as e:
                    group, rank = owners[i]
                    dead = isinstance(e, RayActorError)
                    kind = "died" if dead else "raised"
                    msg = f"{group} worker {rank} {kind} during {what}: {_describe(e)}"
                    self.broken = msg
                    raise WorkerError(msg) from e
        return results

    def call_all(
        self, role: str, method: str, *args: Any, ranks: Sequence[int] | None = None, **kwargs: Any
    ) -> list[Any]:
        """Call ``method`` of the ``role`` backend on ``ranks`` (all) with the same arguments."""
        import ray

        self._check()
        ranks = list(range(self.world_size)) if ranks is None else list(ranks)
        # put once, pass the refs: Ray resolves top-level ref arguments in each worker
        a_ref, k_ref = (ray.put(args), ray.put(kwargs)) if len(ranks) > 1 else (args, kwargs)
        refs = [self.actors[r].call.remote(role, method, a_ref, k_ref) for r in ranks]
        return self.wait(refs, f"{role}.{method}()", [(self.name, r) for r in ranks])

    def kill(self) -> None:
        import ray

        for a in self.actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(a, no_restart=True)


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    return text if len(text) < 20000 else text[:20000] + " ... (truncated)"


# ---------------------------------------------------------------------------------------------
# train proxy
# ---------------------------------------------------------------------------------------------
@dataclass
class WeightHandle:
    """What :meth:`TrainGroup.export_weights` returns: a lazy reference to the trainer's weights.

    Nothing moves until a consumer acts on it. :meth:`RolloutGroup.update_weights` recognises it
    and runs the bucketed broadcast between actors. Iterating it (any other consumer, e.g. a
    local rollout backend) fetches rank 0's full export through the Ray object store (slow path).
    """

    group: TrainGroup
    version: int

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.group.export_list())


class TrainGroup:
    """Driver-side :class:`~rlzoo.kernel.protocols.TrainBackend` over an SPMD group of ``train`` backends."""

    role = "train"

    def __init__(self, workers: WorkerSet) -> None:
        self.workers = workers

    @property
    def world_size(self) -> int:
        return self.workers.world_size

    def _spmd(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.workers.call_all(self.role, method, *args, **kwargs)[0]

    @property
    def version(self) -> int:
        self.workers._check()
        return int(
            self.workers.wait([self.workers.actors[0].get_attr.remote(self.role, "version")], "version")[0]
        )

    def compute_log_probs(self, batch: Any, *, model: str = "actor", with_entropy: bool = False) -> Any:
        return self._spmd("compute_log_probs", batch, model=model, with_entropy=with_entropy)

    def compute_values(self, batch: Any) -> Any:
        return self._spmd("compute_values", batch)

    def update_policy(self, mini_batch: Any, objective: Any) -> dict[str, float]:
        return self._spmd("update_policy", mini_batch, objective)  # type: ignore[no-any-return]

    def update_critic(self, mini_batch: Any, objective: Any) -> dict[str, float]:
        return self._spmd("update_critic", mini_batch, objective)  # type: ignore[no-any-return]

    def export_weights(self) -> WeightHandle:
        """A lazy :class:`WeightHandle`; see the module docstring and ``docs/distributed.md``."""
        return WeightHandle(self, self.version)

    def export_list(self) -> list[tuple[str, Any]]:
        """Rank 0's whole export, through the object store (every rank takes part in the export)."""
        self.workers._check()
        refs = [self.workers.actors[0].export_list.remote(self.role)]
        refs += [a.drain_export.remote(self.role) for a in self.workers.actors[1:]]
        return self.workers.wait(refs, "export_weights()")[0]  # type: ignore[no-any-return]

    def save_checkpoint(self, path: Any, extra_state: Any) -> None:
        self._spmd("save_checkpoint", path, dict(extra_state))

    def load_checkpoint(self, path: Any) -> dict[str, Any]:
        return self._spmd("load_checkpoint", path)  # type: ignore[no-any-return]

    def shutdown(self) -> None:
        if self.workers.broken:
            return
        try:
            self.workers.wait([a.shutdown_backends.remote() for a in self.workers.actors], "shutdown()")
        except WorkerError as e:
            logger.warning("%s", e)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        workers = self.__dict__.get("workers")
        if workers is None or not workers.wait([workers.actors[0].has_attr.remote(self.role, name)], name)[0]:
            raise AttributeError(f"the {self.role} backend has no method {name!r}")

        def method(*args: Any, **kwargs: Any) -> Any:
            return self._spmd(name, *args, **kwargs)

        return method


# ---------------------------------------------------------------------------------------------
# rollout proxy
# ---------------------------------------------------------------------------------------------
class RolloutGroup:
    """Driver-side :class:`~rlzoo.kernel.protocols.RolloutBackend` over rollout replicas (one per worker).

    ``train``: the :class:`TrainGroup` whose :class:`WeightHandle` this group accepts;
    ``colocated``: the replicas live in the train group's workers (same :class:`WorkerSet`).
    """

    role = "rollout"

    def __init__(
        self,
        workers: WorkerSet,
        *,
        train: TrainGroup | None = None,
        colocated: bool = False,
        bucket_size_mb: float = 256.0,
        sync_timeout_s: float = 600.0,
    ) -> None:
        self.workers = workers
        self.train = train
        self.colocated = colocated
        self.bucket_bytes = int(bucket_size_mb * 2**20)
        self.sync_timeout_s = sync_timeout_s
        self._backlog: list[Any] = []
        self._rr = 0
        self._sync_ready = False
        self.last_sync: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def replicas(self) -> int:
        return self.workers.world_size

    @property
    def version(self) -> int:
        self.workers._check()
        return int(
            self.workers.wait([self.workers.actors[0].get_attr.remote(self.role, "version")], "version")[0]
        )

    def _offload_role(self) -> str | None:
        return TrainGroup.role if self.colocated else None

    def _chunks(self, requests: Sequence[Any]) -> list[list[Any]]:
        """Contiguous, near-equal chunks, one per replica (request order is kept)."""
        k = self.replicas
        n = len(requests)
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        out, start = [], 0
        for s in sizes:
            out.append(list(requests[start : start + s]))
            start += s
        return out

    def generate(self, requests: Sequence[Any]) -> list[Any]:
        self.workers._check()
        chunks = self._chunks(requests)
        refs, owners = [], []
        for rank, chunk in enumerate(chunks):
            if chunk:
                refs.append(self.workers.actors[rank].generate.remote(self.role, chunk, self._offload_role()))
                owners.append((self.workers.name, rank))
        out: list[Any] = []
        for part in self.workers.wait(refs, "rollout.generate()", owners):
            out += part
        return out

    def submit(self, requests: Sequence[Any]) -> None:
        self.workers._check()
        chunks = self._chunks(requests)
        k = self.replicas
        chunks = chunks[-self._rr % k :] + chunks[: -self._rr % k] if self._rr % k else chunks
        self._rr += len(requests)
        refs, owners = [], []
        for rank, chunk in enumerate(chunks):
            if chunk:
                refs.append(self.workers.actors[rank].call.remote(self.role, "submit", (chunk,), {}))
                owners.append((self.workers.name, rank))
        self.workers.wait(refs, "rollout.submit()", owners)

    def stream(self, timeout: float | None = None) -> Iterator[Any]:
        """Merge the replicas' streams; same end conditions as one backend's ``stream``."""
        import ray
        from ray.exceptions import RayError

        self.workers._check()
        while self._backlog:
            yield self._backlog.pop(0)
        active: dict[int, Any] = {}
        for rank, a in enumerate(self.workers.actors):
            active[rank] = a.stream_poll.remote(self.role, POLL_S, 4 * POLL_S)
        owner = {ref: rank for rank, ref in active.items()}
        last = time.monotonic()
        try:
            while active:
                wait_for = 8 * POLL_S
                if timeout is not None:
                    remaining = timeout - (time.monotonic() - last)
                    if remaining <= 0:
                        return
                    wait_for = min(wait_for, remaining)
                ready, _ = ray.wait(list(active.values()), num_returns=1, timeout=wait_for)
                for ref in ready:
                    rank = owner.pop(ref)
                    del active[rank]
                    samples, done = self.workers.wait([ref], "rollout.stream()", [(self.workers.name, rank)])[
                        0
                    ]
                    if not done:
                        nxt = self.workers.actors[rank].stream_poll.remote(self.role, POLL_S, 4 * POLL_S)
                        active[rank] = nxt
                        owner[nxt] = rank
                    for s in samples:
                        last = time.monotonic()
                        yield s
        finally:
            # polls still in flight may hold samples: keep them for the next stream()
            for rank, ref in list(active.items()):
                try:
                    samples, _ = ray.get(ref, timeout=30 * POLL_S)
                    self._backlog += samples
                except RayError as e:
                    logger.warning("rollout worker %d: lost a stream poll: %s", rank, e)

    def pause(self) -> None:
        self.workers.call_all(self.role, "pause")

    def resume(self) -> None:
        self.workers.call_all(self.role, "resume")

    def abort(self, request_ids: Iterable[str] | None = None) -> int:
        ids = None if request_ids is None else list(request_ids)
        return int(sum(self.workers.call_all(self.role, "abort", ids)))

    def num_pending(self) -> int:
        return int(sum(self.workers.call_all(self.role, "num_pending"))) + len(self._backlog)

    def shutdown(self) -> None:
        if self.workers.broken:
            return
        if self.colocated:  # the train proxy's shutdown frees the shared workers
            try:
                self.workers.call_all(self.role, "shutdown")
            except WorkerError as e:
                logger.warning("%s", e)
            return
        try:
            self.workers.wait([a.shutdown_backends.remote() for a in self.workers.actors], "shutdown()")
        except WorkerError as e:
            logger.warning("%s", e)

    # -- weights --------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Any, version: int) -> None:
        """``WeightHandle`` of the paired train group: bucketed broadcast between actors.

        Anything else (an iterable of ``(name, tensor)``): copied once into the object store and
        applied by every replica (the slow path, for a train backend that is not a Ray group).
        """
        with self._lock:
            if isinstance(named_tensors, WeightHandle) and named_tensors.group is self.train:
                self._broadcast(version)
                return
            import ray

            items = [(n, t.detach().clone().cpu()) for n, t in named_tensors]
            ref = ray.put(items)
            t0 = time.perf_counter()
            self.workers.wait(
                [a.call.remote(self.role, "update_weights", (ref, version), {}) for a in self.workers.actors],
                "rollout.update_weights()",
            )
            nbytes = sum(t.numel() * t.element_size() for _, t in items)
            self.last_sync = {
                "version": version,
                "bytes": nbytes,
                "seconds": time.perf_counter() - t0,
                "path": "object_store",
            }

    def _members(self) -> list[tuple[Any, dict[str, Any], tuple[str, int]]]:
        """Sync-group members in rank order: (actor, sync_weights kwargs, owner)."""
        assert self.train is not None
        tw = self.train.workers
        members = []
        if self.colocated:
            for rank, a in enumerate(tw.actors):
                kw = {"src": rank == 0, "train_role": TrainGroup.role, "apply_role": self.role}
                members.append((a, kw, (tw.name, rank)))
        else:
            members.append(
                (tw.actors[0], {"src": True, "train_role": TrainGroup.role, "apply_role": None}, (tw.name, 0))
            )
            for rank, a in enumerate(self.workers.actors):
                members.append(
                    (
                        a,
                        {"src": False, "train_role": None, "apply_role": self.role},
                        (self.workers.name, rank),
                    )
                )
        return members

    def _ensure_sync_group(self) -> None:
        if self._sync_ready:
            return
        assert self.train is not None
        members = self._members()
        info = self.train.workers.wait(
            [self.train.workers.actors[0].info.remote()], "weight-sync group setup"
        )[0]
        host, port = info["ip"], info["port"]  # a port free on trainer rank 0's node
        backend = "nccl" if info["gpu_ids"] else "gloo"
        refs = [
            a.init_sync.remote(host, port, r, len(members), backend, self.sync_timeout_s)
            for r, (a, _, _) in enumerate(members)
        ]
        self.workers.wait(refs, "weight-sync group setup", [m[2] for m in members])
        self._sync_ready = True

    def _broadcast(self, version: int) -> None:
        assert self.train is not None
        self.workers._check()
        self.train.workers._check()
        self._ensure_sync_group()
        members = self._members()
        refs = [
            a.sync_weights.remote(version, bucket_bytes=self.bucket_bytes, **kw)  # type: ignore[arg-type]
            for a, kw, _ in members
        ]
        owners = [m[2] for m in members]
        if not self.colocated:  # trainer ranks > 0 take part in an SPMD export
            tw = self.train.workers
            refs += [a.drain_export.remote(TrainGroup.role) for a in tw.actors[1:]]
            owners += [(tw.name, r) for r in range(1, tw.world_size)]
        t0 = time.perf_counter()
        try:
            results = self.workers.wait(refs, f"weight sync to v{version}", owners)
        finally:  # a failed sync leaves peers inside the collective: both groups are unusable
            if self.workers.broken:
                self.train.workers.broken = self.train.workers.broken or self.workers.broken
        wall = time.perf_counter() - t0
        src = results[0]
        from rlzoo.distributed.weight_sync import SyncStats

        stats = SyncStats(version, src["bytes"], src["tensors"], src["buckets"], wall)
        stats.log()
        self.last_sync = {**src, "seconds": wall, "path": "broadcast", "members": len(members)}
