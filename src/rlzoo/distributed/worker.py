"""The actor side of the worker groups: :class:`BackendWorker`, one Ray actor per GPU / CPU worker.

It hosts backends by *role* (``"train"``, ``"rollout"``; colocated workers host both), built from
``(target, params, spec)`` (``target`` is the registry's lazy ``"module:attr"`` string, imported in
the worker) after the torch.distributed environment is set. The driver side (the actor set and the
backend proxies) is :mod:`rlzoo.distributed.worker_group`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

__all__ = ["BackendWorker"]

logger = logging.getLogger("rlzoo.distributed")


def _resolve_target(target: Any) -> Any:
    if isinstance(target, str):
        from rlzoo.kernel.registry import _resolve

        return _resolve(target)
    return target


class BackendWorker:
    """One worker process (wrapped with ``ray.remote`` by :class:`~rlzoo.distributed.worker_group.WorkerSet`)."""

    def __init__(self, name: str, rank: int) -> None:
        self.name, self.rank = name, rank
        self.backends: dict[str, Any] = {}
        self.sync_group: Any = None

    # -- setup ----------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        import ray

        from rlzoo.distributed.weight_sync import free_port

        ctx = ray.get_runtime_context()
        return {
            "ip": ray.util.get_node_ip_address(),
            "node_id": ctx.get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "port": free_port(),
            "pid": os.getpid(),
        }

    def set_env(self, env: dict[str, str]) -> None:
        os.environ.update(env)

    def set_threads(self, n: int) -> int:
        """torch's CPU threads in this process (``placement.<pool>.threads``); returns the count now."""
        import torch

        torch.set_num_threads(int(n))
        return torch.get_num_threads()

    def build(self, role: str, target: Any, params: Any, spec: Any) -> None:
        self.backends[role] = _resolve_target(target)(params, spec)

    def _backend(self, role: str) -> Any:
        try:
            return self.backends[role]
        except KeyError:
            raise RuntimeError(f"{self.name} worker {self.rank} hosts no {role!r} backend") from None

    # -- generic calls --------------------------------------------------------------------------
    def call(self, role: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return getattr(self._backend(role), method)(*args, **kwargs)

    def get_attr(self, role: str, attr: str) -> Any:
        return getattr(self._backend(role), attr)

    def has_attr(self, role: str, attr: str) -> bool:
        return role in self.backends and callable(getattr(self.backends[role], attr, None))

    # -- rollout --------------------------------------------------------------------------------
    def generate(self, role: str, requests: list[Any], offload_role: str | None) -> list[Any]:
        """``generate`` with the colocated train backend's ``offload()`` / ``onload()`` around it."""
        other = self.backends.get(offload_role) if offload_role else None
        off = getattr(other, "offload", None) if other is not None else None
        on = getattr(other, "onload", None) if other is not None else None
        if callable(off):
            off()
        try:
            return list(self._backend(role).generate(requests)) if requests else []
        finally:
            if callable(on):
                on()

    def stream_poll(self, role: str, wait_s: float, max_s: float) -> tuple[list[Any], bool]:
        """Samples that finish within ``max_s`` (stopping after ``wait_s`` without one); ``done``
        is True when nothing is pending on this replica any more."""
        backend = self._backend(role)
        out: list[Any] = []
        deadline = time.monotonic() + max_s
        it = backend.stream(timeout=wait_s)
        try:
            for s in it:
                out.append(s)
                if time.monotonic() > deadline:
                    break
        finally:
            close = getattr(it, "close", None)
            if callable(close):
                close()
        return out, backend.num_pending() == 0

    # -- weights --------------------------------------------------------------------------------
    def init_sync(
        self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float
    ) -> None:
        from rlzoo.distributed.weight_sync import TorchSyncGroup

        self.sync_group = TorchSyncGroup(host, port, rank, world_size, backend=backend, timeout_s=timeout_s)

    def sync_weights(
        self,
        version: int,
        *,
        src: bool,
        train_role: str | None,
        apply_role: str | None,
        bucket_bytes: int,
    ) -> dict[str, Any]:
        """One member's part of a weight sync (see :mod:`rlzoo.distributed.weight_sync`).

        ``src``: this is trainer rank 0: consume its ``export_weights()`` and broadcast it.
        Otherwise receive; when ``train_role`` is set (other trainer ranks in colocated mode) the
        local train backend's ``export_weights()`` is drained in a thread meanwhile (an SPMD
        backend's export is collective). ``apply_role``: the rollout backend that takes the
        weights here (None: drop them).
        """
        from rlzoo.distributed.weight_sync import SyncStats, apply_and_drain

        group = self.sync_group
        if group is None:
            raise RuntimeError("sync_weights before init_sync")
        stats = SyncStats(version=version)
        target = self._backend(apply_role) if apply_role else None

        def apply(stream: Iterable[Any]) -> None:
            if target is not None:
                target.update_weights(stream, version)

        if src:
            assert train_role is not None
            stream = group.send(self._backend(train_role).export_weights(), bucket_bytes, stats)
            apply_and_drain(apply, stream)
        else:
            errors: list[BaseException] = []
            drainer = None
            if train_role is not None:
                drainer = threading.Thread(target=self._drain, args=(train_role, errors), daemon=True)
                drainer.start()
            apply_and_drain(apply, group.receive(stats))
            if drainer is not None:
                drainer.join()
                if errors:
                    raise errors[0]
        return {
            "version": version,
            "bytes": stats.bytes,
            "tensors": stats.tensors,
            "buckets": stats.buckets,
            "seconds": stats.seconds,
        }

    def _drain(self, role: str, errors: list[BaseException]) -> None:
        try:
            for _ in self._backend(role).export_weights():
                pass
        except BaseException as e:  # reported by the caller
            errors.append(e)

    def drain_export(self, role: str) -> None:
        """Take part in an SPMD ``export_weights()`` and drop what it yields (ranks > 0)."""
        errors: list[BaseException] = []
        self._drain(role, errors)
        if errors:
            raise errors[0]

    def export_list(self, role: str) -> list[tuple[str, Any]]:
        """The whole export as a list of copies (the slow fallback path, not the broadcast)."""
        return [(n, t.detach().clone().cpu()) for n, t in self._backend(role).export_weights()]

    def shutdown_backends(self) -> None:
        for b in self.backends.values():
            shut = getattr(b, "shutdown", None)
            if callable(shut):
                try:
                    shut()
                except Exception as e:  # best effort
                    logger.warning("backend shutdown failed: %s", e)
        self.backends.clear()
