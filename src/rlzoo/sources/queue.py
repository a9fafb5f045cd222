"""The staleness-aware message queue between a Rollouter and a Trainer (pure Python, no torch).

Everything the two sides of the ``fully_async`` runner tell each other goes through one
:class:`StalenessQueue`: groups (Rollouter -> Trainer), weight pushes, admission holds, validation
parking, dropped groups to regenerate, failures and stop (both ways), and counters for metrics. So
either side can later become a Ray actor holding a handle to the queue.

Units: the queue counts **groups** (one prompt with its ``n`` responses). Versions are **policy
versions** (``param_version``: the number of weight pushes so far).

Two invariants, both enforced under one lock:

1. **Window budget (samples).** ``window_started`` = groups started since the last push + groups
   carried over from older weights at that push (queued or in flight). The Rollouter may start a
   group only while ``window_started < budget``, ``budget = floor((1 + s) * K * R * M)``. A group
   that will never be trained (dropped, filtered, cancelled) gives its slot back.
2. **Version bound.** No group with ``param_version - group.version > max_staleness`` is ever
   handed to the Trainer (``group.version``: the oldest policy version among its tokens). Such a
   group is dropped when it is put, when a push makes it too old while queued, and (a last check)
   when taken; dropped groups are counted and handed back to the Rollouter to regenerate.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlzoo.kernel.errors import RlzooError

__all__ = ["Group", "QueueExhausted", "RolloutFailed", "StalenessQueue", "TrainerFailed"]


class RolloutFailed(RuntimeError):
    """The Rollouter side failed; raised on the Trainer side (``__cause__`` is the original error)."""


class TrainerFailed(RuntimeError):
    """The Trainer side failed or stopped; raised on the Rollouter side."""


class QueueExhausted(RuntimeError):
    """The Rollouter has drawn every prompt it may and nothing more will come."""


@dataclass
class Group:
    """One prompt's complete group, as the Rollouter hands it to the Trainer."""

    seq: int  # draw order; a step's groups are sorted by it
    version: int  # oldest policy version among the group's tokens
    max_version: int  # newest policy version among them
    n_samples: int
    payload: Any = None  # samples, rewards, prompt (opaque to the queue)
    put_order: int = field(default=0, compare=False)


class StalenessQueue:
    """Bounded, staleness-aware queue of :class:`Group` s. Thread-safe.

    Args:
        budget: groups the Rollouter may start per sync window (invariant 1).
        max_staleness: largest ``param_version - group.version`` trained on (invariant 2).
        capacity: groups queued or in flight at most (None: ``budget``).
        param_version: the policy version the rollout backend holds at the start.
        backend_version: the rollout backend's own version number for it (see :meth:`version_of`).
    """

    def __init__(
        self,
        *,
        budget: int,
        max_staleness: int,
        capacity: int | None = None,
        param_version: int = 0,
        backend_version: int = 0,
    ) -> None:
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        self.budget = int(budget)
        self.max_staleness = int(max_staleness)
        self.capacity = int(capacity) if capacity is not None else self.budget
        self._cv = threading.Condition()
        self._items: list[Group] = []
        self._param_version = int(param_version)
        self._vmap_keys: list[int] = [int(backend_version)]  # backend versions at each push, ascending
        self._vmap_vals: list[int] = [int(param_version)]
        self.window_started = 0
        self.in_flight = 0
        #: what the last push carried into its window: (complete groups queued, groups in flight)
        self.carried = (0, 0)
        self._put_count = 0
        self._hold = False
        self._drawing_done = False
        self._park_requested = False
        self._parked = False
        self._regen: list[Any] = []  # payloads of dropped groups, to generate again
        self._error: BaseException | None = None
        self._error_side = ""
        self._stop = False
        self.counters: dict[str, float] = {
            "started_groups": 0,
            "put_groups": 0,
            "put_samples": 0,
            "taken_groups": 0,
            "dropped_groups": 0,
            "dropped_samples": 0,
            "discarded_groups": 0,
            "max_window_started": 0,
        }
        self._stats: dict[str, float] = {}
        #: called under the queue's lock with each dropped group and where (put / sync / get): the
        #: runner counts a new attempt for its prompt, so a checkpoint taken meanwhile records it
        self.on_drop: Callable[[Group, str], None] | None = None

    # ------------------------------------------------------------------------------------------
    # versions
    # ------------------------------------------------------------------------------------------
    @property
    def param_version(self) -> int:
        return self._param_version

    def version_of(self, backend_version: int) -> int:
        """The policy version of a rollout backend version number (the last push at or before it)."""
        with self._cv:
            i = bisect.bisect_right(self._vmap_keys, int(backend_version)) - 1
            return self._vmap_vals[max(i, 0)]

    def register_version(self, backend_version: int, param_version: int) -> None:
        """Announce the backend version number a push is about to use (before the weights land)."""
        with self._cv:
            if backend_version > self._vmap_keys[-1]:
                self._vmap_keys.append(int(backend_version))
                self._vmap_vals.append(int(param_version))
            elif backend_version == self._vmap_keys[-1]:
                self._vmap_vals[-1] = int(param_version)

    def staleness(self, group: Group) -> int:
        return self._param_version - group.version

    # ------------------------------------------------------------------------------------------
    # Rollouter side
    # ------------------------------------------------------------------------------------------
    def _admits(self) -> bool:
        return (
            not self._hold
            and not self._stop
            and self.window_started < self.budget
            and self.in_flight + len(self._items) < self.capacity
        )

    def _start(self) -> None:
        self.window_started += 1
        self.in_flight += 1
        self.counters["started_groups"] += 1
        self.counters["max_window_started"] = max(self.counters["max_window_started"], self.window_started)
        assert self.window_started <= self.budget, "window budget exceeded"

    def try_acquire(self) -> bool:
        """Start one fresh group if the window budget and the capacity allow (never waits)."""
        with self._cv:
            self._raise_if_stopped_for_rollouter()
            if self._drawing_done or not self._admits():
                return False
            self._start()
            return True

    def acquire_regen(self) -> Any | None:
        """Start regenerating one dropped group, if any and admission allows; returns its payload."""
        with self._cv:
            self._raise_if_stopped_for_rollouter()
            if not self._regen or not self._admits():
                return None
            self._start()
            return self._regen.pop(0)

    def cancel(self) -> None:
        """A started group will never be put (its prompt is gone, or it was filtered away)."""
        with self._cv:
            self.in_flight -= 1
            self.window_started -= 1
            self.counters["discarded_groups"] += 1
            self._cv.notify_all()

    def drawing_done(self) -> None:
        """The Rollouter will start no fresh group any more (it keeps regenerating dropped ones)."""
        with self._cv:
            self._drawing_done = True
            self._cv.notify_all()

    def put(self, group: Group) -> bool:
        """Hand a complete group to the Trainer. False: it is already too stale and was dropped."""
        with self._cv:
            self._raise_if_stopped_for_rollouter()
            self.in_flight -= 1
            if self._param_version - group.version > self.max_staleness:
                self.window_started -= 1
                self._drop(group, "put")
                self._cv.notify_all()
                return False
            self._put_count += 1
            group.put_order = self._put_count
            self._items.append(group)
            self.counters["put_groups"] += 1
            self.counters["put_samples"] += group.n_samples
            self._cv.notify_all()
            return True

    def wait_for_change(self, timeout: float) -> None:
        """Sleep until something the Rollouter may react to happens (or ``timeout``)."""
        with self._cv:
            if (
                self._stop
                or self._park_requested
                or self._regen
                or (self._admits() and not self._drawing_done)
            ):
                return
            self._cv.wait(timeout)

    # -- validation parking: the Trainer asks, the Rollouter stops consuming until unparked --------
    @property
    def park_requested(self) -> bool:
        return self._park_requested

    def parked_wait(self, poll: float = 0.05) -> None:
        """Rollouter: acknowledge a park request and wait until unparked (or stopped)."""
        with self._cv:
            self._parked = True
            self._cv.notify_all()
            while self._park_requested and not self._stop:
                self._cv.wait(poll)
            self._parked = False
            self._cv.notify_all()

    # ------------------------------------------------------------------------------------------
    # Trainer side
    # ------------------------------------------------------------------------------------------
    def get(self, k: int, *, timeout: float, poll: float = 0.05) -> list[Group]:
        """Take ``k`` groups, stalest first (then in arrival order); waits for them.

        Raises :class:`RolloutFailed` if the Rollouter failed, :class:`QueueExhausted` if fewer
        than ``k`` groups can ever arrive, :class:`TimeoutError` after ``timeout`` seconds
        without a new group.
        """
        last_progress = time.monotonic()
        seen = -1
        with self._cv:
            while True:
                self._raise_if_failed_for_trainer()
                # last check of invariant 2 (queued groups are purged at each push already)
                for g in [g for g in self._items if self._param_version - g.version > self.max_staleness]:
                    self._items.remove(g)
                    self._drop(g, "get")
                if len(self._items) >= k:
                    self._items.sort(key=lambda g: (g.version, g.put_order))
                    taken, self._items = self._items[:k], self._items[k:]
                    self.counters["taken_groups"] += k
                    self._cv.notify_all()
                    return taken
                if self._drawing_done and self.in_flight == 0 and not self._regen:
                    raise QueueExhausted(
                        f"the Rollouter drew every prompt it may (total_rollout_steps) and only "
                        f"{len(self._items)} of the {k} groups a step needs remain"
                    )
                if self._put_count != seen:
                    seen, last_progress = self._put_count, time.monotonic()
                elif time.monotonic() - last_progress > timeout:
                    raise TimeoutError(
                        f"the trainer waited {timeout:.0f}s (runner.wait_timeout_s) for {k} groups; queue "
                        f"{self.describe()}"
                    )
                self._cv.wait(poll)

    def on_sync(self, param_version: int) -> int:
        """The Trainer pushed weights of ``param_version``: purge groups now too stale and open a new
        window (carried = groups queued or in flight). Returns the number of groups dropped."""
        with self._cv:
            self._param_version = int(param_version)
            stale = [g for g in self._items if self._param_version - g.version > self.max_staleness]
            for g in stale:
                self._items.remove(g)
                self._drop(g, "sync")
            self.window_started = self.in_flight + len(self._items)
            self.carried = (len(self._items), self.in_flight)
            self.counters["max_window_started"] = max(
                self.counters["max_window_started"], self.window_started
            )
            self._cv.notify_all()
            return len(stale)

    def hold(self) -> None:
        """Stop admitting new groups (the Trainer drains in-flight requests before a push)."""
        with self._cv:
            self._hold = True

    def release(self) -> None:
        with self._cv:
            self._hold = False
            self._cv.notify_all()

    def wait_drained(self, *, timeout: float, poll: float = 0.05) -> None:
        """Wait until no group is in flight (use after :meth:`hold`)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self.in_flight > 0:
                self._raise_if_failed_for_trainer()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"in-flight requests did not finish within {timeout:.0f}s; queue {self.describe()}"
                    )
                self._cv.wait(poll)

    def park(self, *, timeout: float, poll: float = 0.05) -> None:
        """Ask the Rollouter to stop consuming the rollout stream; returns once it has."""
        deadline = time.monotonic() + timeout
        with self._cv:
            self._park_requested = True
            self._cv.notify_all()
            while not self._parked:
                self._raise_if_failed_for_trainer()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the Rollouter did not park within {timeout:.0f}s")
                self._cv.wait(poll)

    def unpark(self) -> None:
        with self._cv:
            self._park_requested = False
            self._cv.notify_all()

    # ------------------------------------------------------------------------------------------
    # failures, stop, metrics
    # ------------------------------------------------------------------------------------------
    def fail(self, exc: BaseException, side: str) -> None:
        """Record the first failure of either side and stop both."""
        with self._cv:
            if self._error is None:
                self._error, self._error_side = exc, side
            self._stop = True
            self._cv.notify_all()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stop

    @property
    def error(self) -> BaseException | None:
        return self._error

    def _raise_if_failed_for_trainer(self) -> None:
        if self._error is not None and self._error_side != "trainer":
            if isinstance(self._error, RlzooError):  # a user's error (a failure streak): as under sync
                raise self._error
            raise RolloutFailed(f"the {self._error_side} failed: {self._error!r}") from self._error
        if self._stop:
            raise RolloutFailed("the queue was stopped")

    def _raise_if_stopped_for_rollouter(self) -> None:
        if self._stop:
            raise TrainerFailed("the trainer stopped" + (f": {self._error!r}" if self._error else ""))

    def _drop(self, group: Group, where: str) -> None:
        self.counters["dropped_groups"] += 1
        self.counters["dropped_samples"] += group.n_samples
        self._regen.append(group.payload)
        if self.on_drop is not None:
            self.on_drop(group, where)

    def report(self, **stats: float) -> None:
        """Rollouter: add to counters the Trainer reads with :meth:`take_stats`."""
        with self._cv:
            for k, v in stats.items():
                self._stats[k] = self._stats.get(k, 0.0) + float(v)

    def take_stats(self) -> dict[str, float]:
        """Trainer: the reported counters since the last call."""
        with self._cv:
            out, self._stats = self._stats, {}
            return out

    def size(self) -> int:
        with self._cv:
            return len(self._items)

    def describe(self) -> str:
        return (
            f"size={len(self._items)} in_flight={self.in_flight} window_started={self.window_started}/"
            f"{self.budget} param_version={self._param_version} hold={self._hold} "
            f"drawing_done={self._drawing_done} regen={len(self._regen)}"
        )

    def snapshot(self) -> dict[str, float]:
        """Gauges and cumulative counters for the step's metrics."""
        with self._cv:
            return {
                "queue/size": float(len(self._items)),
                "queue/in_flight": float(self.in_flight),
                "queue/window_started": float(self.window_started),
                "queue/budget": float(self.budget),
                "queue/carried_queued": float(self.carried[0]),
                "queue/carried_in_flight": float(self.carried[1]),
                "rollouter/samples_collected": self.counters["put_samples"],
                "rollouter/groups_collected": self.counters["put_groups"],
                "rollouter/dropped_samples": self.counters["dropped_samples"],
                "rollouter/dropped_groups": self.counters["dropped_groups"],
                "param_version": float(self._param_version),
            }

    def staleness_of(self, groups: Sequence[Group]) -> list[int]:
        with self._cv:
            return [self._param_version - g.version for g in groups]
