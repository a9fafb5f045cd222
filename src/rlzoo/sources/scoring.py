"""The fully-async runner's scoring stage: the Rollouter hands each chunk of finished samples here and
goes back to the rollout stream, so generation never waits for a scorer (code run in a sandbox,
a remote grader, a reward model).

    Rollouter thread                      scoring stage (``workers`` daemon threads)
    stream() -> chunk ── submit(chunk) ──▶ score(chunk) -> rewards
    harvest(): oldest chunk first ◀────── Future

Bounded twice: at most ``workers`` chunks are scored at once, and every chunk waiting here belongs
to a group the :class:`~rlzoo.sources.queue.StalenessQueue` counts as in flight, so the backlog is
bounded by the queue's window budget / capacity. Results are handed back in submission order
(:meth:`ScoringStage.harvest`), so groups complete in the order their samples arrived, as when the
Rollouter scored them itself. A score call that raises (a scorer failure streak: ``RewardFailureError``)
raises from :meth:`harvest` on the Rollouter thread, which fails the queue as before.

Threads are daemon threads, started at the first chunk: a scorer stuck past every timeout never
keeps the interpreter from exiting (the reward managers bound each call with ``reward.manager.timeout``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future
from typing import Generic, TypeVar

__all__ = ["ScoringStage"]

S = TypeVar("S")
R = TypeVar("R")


class ScoringStage(Generic[S, R]):
    """Scores chunks of samples on ``workers`` daemon threads; hands results back oldest first.

    Args:
        score: ``score(samples) -> results`` (one result per sample; thread-safe).
        workers: chunks scored at once.
        name: thread name prefix.

    Not thread-safe on the caller's side: one thread (the Rollouter) submits and harvests.
    """

    def __init__(self, score: Callable[[list[S]], list[R]], workers: int, name: str = "rlzoo-scorer") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.score = score
        self.workers = int(workers)
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[list[S], Future[list[R]]] | None] = queue.SimpleQueue()
        self._pending: deque[tuple[list[S], Future[list[R]]]] = deque()
        self._threads: list[threading.Thread] = []
        self._stopped = False
        self.busy_s = 0.0  # seconds spent in score() over all workers (read by the Rollouter)
        self._busy_lock = threading.Lock()

    # -- the Rollouter's side ---------------------------------------------------------------------
    def submit(self, samples: Sequence[S]) -> None:
        """Queue one chunk for scoring (returns at once)."""
        if self._stopped:
            raise RuntimeError("the scoring stage was stopped")
        if not self._threads:
            for i in range(self.workers):
                t = threading.Thread(target=self._work, name=f"{self.name}-{i}", daemon=True)
                t.start()
                self._threads.append(t)
        job: tuple[list[S], Future[list[R]]] = (list(samples), Future())
        self._pending.append(job)
        self._jobs.put(job)

    def pending(self) -> int:
        """Chunks submitted and not yet harvested."""
        return len(self._pending)

    def harvest(self, wait: float = 0.0) -> list[tuple[list[S], list[R]]]:
        """The scored chunks, oldest first, up to the first one still being scored; waits up to
        ``wait`` seconds for the oldest. Raises what a score call raised (the chunks before it are
        handed back first, by the call before)."""
        out: list[tuple[list[S], list[R]]] = []
        deadline = time.monotonic() + wait
        while self._pending:
            samples, fut = self._pending[0]
            if not fut.done():
                left = deadline - time.monotonic()
                if out or left <= 0 or not futures.wait([fut], timeout=left).done:
                    break
            if out and fut.exception() is not None:
                break  # raised by the next call, once the chunks before it are handed back
            self._pending.popleft()
            out.append((samples, fut.result()))
        return out

    def stop(self) -> None:
        """No more chunks; the workers end after the call they are in (chunks not started are dropped)."""
        self._stopped = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[1].cancel()
        for _ in self._threads:
            self._jobs.put(None)
        self._pending.clear()

    # -- a worker ---------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            samples, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            t0 = time.perf_counter()
            try:
                results = self.score(samples)
                if len(results) != len(samples):
                    raise RuntimeError(f"score() returned {len(results)} results for {len(samples)} samples")
            except BaseException as exc:
                fut.set_exception(exc)
            else:
                fut.set_result(results)
            finally:
                with self._busy_lock:
                    self.busy_s += time.perf_counter() - t0
