"""Where the agents' waiting happens: environment and tool calls on a side loop, and the pump.

:class:`SideLoop` is one asyncio loop on a daemon thread with a bounded thread pool: a sync call
runs in the pool, an ``async`` one is awaited on the loop, each under its timeout, so a slow
environment never blocks the engine or the caller. Work is spawned with a tag and a subject; its
result (or its error) comes back as an :class:`Event` on a queue that the owner reads on its own
thread, where its state lives.

:class:`Pump` is one step of moving work along on the caller's thread: the side loop's finished
work first, then one poll of the engine's stream, or, with nothing on the engine, a short wait
for side work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import queue
import threading
import traceback
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rlzoo.kernel.protocols import RolloutBackend, Sample
from rlzoo.rollout_kit.streams import POLL_S

__all__ = ["Event", "Pump", "SideLoop"]

T = TypeVar("T")


@dataclass(frozen=True)
class Event(Generic[T]):
    """Spawned work that finished: ``what`` is its tag (``"error"`` when it raised: ``value`` is then
    the text ``"<tag>: <Type>: <message>"`` and ``traceback`` where it was raised), ``subject`` what it
    was spawned for."""

    what: str
    subject: T
    value: Any
    traceback: str | None = None


class SideLoop(Generic[T]):
    """An asyncio loop on its own thread; at most ``concurrency`` calls run at once.

    Args:
        concurrency: the thread pool's size and the bound on calls in flight.
        name: the loop thread's name (the pool's threads are ``rlzoo-env-*``).
    """

    def __init__(self, concurrency: int, name: str = "rlzoo-agents") -> None:
        self._events: queue.Queue[Event[T]] = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._pool = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="rlzoo-env")
        self._loop.set_default_executor(self._pool)
        self._gate = asyncio.Semaphore(concurrency)
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def spawn(self, what: str, subject: T, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` on the loop; its result comes back as ``Event(what, subject, result)``."""
        fut = asyncio.run_coroutine_threadsafe(work, self._loop)

        def done(f: concurrent.futures.Future[Any]) -> None:
            try:
                self._events.put(Event(what, subject, f.result()))
            except BaseException as exc:
                tb = "".join(traceback.format_exception(exc))
                self._events.put(Event("error", subject, f"{what}: {type(exc).__name__}: {exc}", tb))

        fut.add_done_callback(done)

    async def call(self, fn: Callable[..., Any], *args: Any, timeout: float, setting: str = "timeout") -> Any:
        """``fn(*args)`` (sync in the thread pool, or awaited) within ``timeout`` seconds; on the loop.
        A late call raises TimeoutError naming the limit and its ``setting``."""
        try:
            return await self._call(fn, *args, timeout=timeout)
        except TimeoutError:
            raise TimeoutError(f"no answer within {timeout:g} s ({setting}={timeout:g})") from None

    async def _call(self, fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
        async with self._gate:
            if inspect.iscoroutinefunction(fn):
                return await asyncio.wait_for(fn(*args), timeout)
            loop = asyncio.get_running_loop()

            def run() -> Any:
                return fn(*args)

            out = await asyncio.wait_for(loop.run_in_executor(None, run), timeout)
            if inspect.isawaitable(out):
                out = await asyncio.wait_for(out, timeout)
            return out

    def wait(self, timeout: float) -> Event[T] | None:
        """The next finished work, waiting up to ``timeout`` seconds for it."""
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def ready(self) -> Iterator[Event[T]]:
        """The finished work there is now, without waiting."""
        while True:
            try:
                yield self._events.get_nowait()
            except queue.Empty:
                return

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class Pump(Generic[T]):
    """One step of moving work along (call it); on the caller's thread.

    Args:
        side: the side loop whose events ``on_event`` handles.
        engine: the rollout backend whose finished samples ``on_sample`` handles.
        engine_busy: whether anything is on the engine (else the pump waits for side work).
        poll: seconds one step waits at most.
    """

    side: SideLoop[T]
    engine: RolloutBackend
    engine_busy: Callable[[], bool]
    on_event: Callable[[Event[T]], None]
    on_sample: Callable[[Sample], None]
    poll: float = POLL_S

    def __call__(self) -> None:
        self.drain()
        if not self.engine_busy():  # nothing on the engine: wait for side work instead
            event = self.side.wait(self.poll)
            if event is not None:
                self.on_event(event)
            return
        for s in self.engine.stream(timeout=self.poll):
            self.on_sample(s)
            self.drain()

    def drain(self) -> None:
        for event in self.side.ready():
            self.on_event(event)
