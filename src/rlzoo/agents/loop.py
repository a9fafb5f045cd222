"""Where the agents' waiting happens: environment and tool calls on a side loop, the pump, and the
ledger of finished trajectories.

:class:`SideLoop` is one asyncio loop on a daemon thread: a sync call runs on a daemon thread of
its own, an ``async`` one is awaited on the loop, each under its timeout and at most
``concurrency`` at once, so a slow environment never blocks the engine or the caller, and one that
hangs for ever never holds a slot past its timeout nor the process at exit. Work is spawned with a tag and a subject; its
result (or its error) comes back as an :class:`Event` on a queue that the owner reads on its own
thread, where its state lives.

:class:`Pump` is one step of moving work along on the caller's thread: the side loop's finished
work first, then one poll of the engine's stream, or, with nothing on the engine, a short wait
for side work.

:class:`Finished` is the batch bookkeeping every rollout composed over the engine shares: trajectories
live and finished, ``stream`` and ``generate`` over them, ``num_pending``; :class:`OverEngine` the
``RolloutBackend`` methods such a rollout answers with them and with its engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import queue
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rlzoo.kernel.protocols import GenerationRequest, RolloutBackend, Sample
from rlzoo.rollout_kit.streams import POLL_S

__all__ = ["CallTimeout", "Event", "Finished", "OverEngine", "Pump", "SideLoop", "UserCodeError"]

T = TypeVar("T")


@dataclass(frozen=True)
class Event(Generic[T]):
    """Spawned work that finished: ``what`` is its tag (``"error"`` when it raised: ``value`` is then
    the exception), ``subject`` what it was spawned for."""

    what: str
    subject: T
    value: Any


class UserCodeError(Exception):
    """User code (an environment, a tool) raised a ``BaseException`` that is not an ``Exception``
    (``SystemExit``, ``KeyboardInterrupt``, ...): turned into an ordinary error so that it fails its
    call, never the side loop. The original is ``__cause__``; :attr:`traceback` its text."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        self.traceback = "".join(traceback.format_exception(exc))


class _Raised(Exception):
    """Carries a ``TimeoutError`` user code raised past ``wait_for``, which would take it for its own."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


class CallTimeout(TimeoutError):
    """A call ran past its limit; the message names the limit and the setting that sets it.

    ``abandoned``: a synchronous call's thread was left running (Python cannot stop a thread).
    """

    def __init__(self, message: str, *, abandoned: bool) -> None:
        super().__init__(message)
        self.abandoned = abandoned


class SideLoop(Generic[T]):
    """An asyncio loop on its own thread; at most ``concurrency`` calls run at once.

    A synchronous call runs on a daemon thread of its own, so one that hangs past its timeout is
    abandoned: its slot is given back at once (the next calls never wait for it), and it never
    keeps the process from exiting. :attr:`abandoned` counts such calls, :attr:`stuck` those still
    running. An ``async`` call is awaited on the loop and cancelled at its timeout. A
    ``BaseException`` from user code fails its call as :class:`UserCodeError`.

    Args:
        concurrency: the bound on calls in flight.
        name: the loop thread's name (call threads are ``rlzoo-env-call``).
    """

    def __init__(self, concurrency: int, name: str = "rlzoo-agents") -> None:
        self._events: queue.Queue[Event[T]] = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._gate = asyncio.Semaphore(concurrency)
        self._stuck: set[threading.Thread] = set()
        self._stuck_lock = threading.Lock()
        self.abandoned = 0
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def stuck(self) -> int:
        """Abandoned synchronous calls whose thread is still running."""
        with self._stuck_lock:
            return len(self._stuck)

    def spawn(self, what: str, subject: T, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` on the loop; its result comes back as ``Event(what, subject, result)``, an
        error as ``Event("error", subject, exc)`` (the exception itself)."""
        fut = asyncio.run_coroutine_threadsafe(work, self._loop)

        def done(f: concurrent.futures.Future[Any]) -> None:
            try:
                self._events.put(Event(what, subject, f.result()))
            except BaseException as exc:
                self._events.put(Event("error", subject, exc))

        fut.add_done_callback(done)

    def post(self, what: str, subject: T, value: Any) -> None:
        """Hand ``value`` to the owner's thread as ``Event(what, subject, value)`` now, from any
        thread: nothing runs on the loop (no hop through it)."""
        self._events.put(Event(what, subject, value))

    async def call(self, fn: Callable[..., Any], *args: Any, timeout: float, limit: str) -> Any:
        """``fn(*args)`` (sync on a thread of its own, or awaited) within ``timeout`` seconds; on the
        loop. ``limit`` words the limit for the timeout's message (``"environment step exceeded
        2 s (rollout.multi_turn.env_timeout_s)"``: ``limit`` is that text with ``{timeout}`` for
        the seconds)."""
        async with self._gate:
            if inspect.iscoroutinefunction(fn):
                return await self._await(fn(*args), timeout, limit)
            out = await self._threaded(fn, args, timeout, limit)
            if inspect.isawaitable(out):
                out = await self._await(out, timeout, limit)
            return out

    async def _await(self, work: Any, timeout: float, limit: str) -> Any:
        async def guarded() -> Any:
            try:
                return await work
            except (asyncio.CancelledError, GeneratorExit):  # the loop's own: cancelled, or closed
                raise
            except TimeoutError as exc:  # the user's own, not the limit's
                raise _Raised(exc) from exc
            except BaseException as exc:  # SystemExit & co. would end the loop's thread
                raise UserCodeError(exc) from exc

        try:
            return await asyncio.wait_for(guarded(), timeout)
        except _Raised as raised:
            raise raised.exc from None
        except TimeoutError:
            raise CallTimeout(limit.replace("{timeout}", f"{timeout:g} s"), abandoned=False) from None

    async def _threaded(
        self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float, limit: str
    ) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if not fut.done():
                (fut.set_result if ok else fut.set_exception)(value)

        def run() -> None:
            try:
                out: Any = fn(*args)
                ok = True
            except Exception as exc:
                out, ok = exc, False
            except BaseException as exc:  # not the caller's: this is not the main thread
                err = UserCodeError(exc)
                err.__cause__ = exc
                out, ok = err, False
            finally:
                with self._stuck_lock:
                    self._stuck.discard(threading.current_thread())
            with contextlib.suppress(RuntimeError):  # the loop closed while this call hung: nobody waits
                loop.call_soon_threadsafe(settle, ok, out)

        thread = threading.Thread(target=run, name="rlzoo-env-call", daemon=True)
        thread.start()
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            if not fut.cancelled():  # the call raised TimeoutError itself, in time
                raise
            with self._stuck_lock:
                if thread.is_alive():
                    self._stuck.add(thread)
            self.abandoned += 1
            raise CallTimeout(limit.replace("{timeout}", f"{timeout:g} s"), abandoned=True) from None

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
        """Stop the loop; abandoned call threads are daemons and never hold the process."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


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


class Finished:
    """A composed rollout's finished trajectories, keyed ``(request id, choice index)``, each the
    samples it made (one, or an episode's several), until ``stream`` yields them or the
    ``generate`` call that wants them takes them. ``pump`` moves work along (a :class:`Pump`);
    ``lock`` is the owner's (its trajectories' state and this ledger change together).
    """

    def __init__(self, lock: threading.RLock, pump: Callable[[], None]) -> None:
        self.lock = lock
        self.pump = pump
        self.done: dict[tuple[str, int], list[Sample]] = {}
        self.claimed: set[tuple[str, int]] = set()  # wanted by a generate() call
        self.live = 0  # trajectories started and not finished

    def start(self) -> None:
        """One trajectory more is under way (call under :attr:`lock`)."""
        self.live += 1

    def put(self, key: tuple[str, int], samples: list[Sample]) -> None:
        """The trajectory ``key`` finished with ``samples`` (call under :attr:`lock`)."""
        self.done[key] = samples
        self.live -= 1

    def _take(self) -> list[Sample]:
        with self.lock:
            for k in self.done:
                if k not in self.claimed:
                    return self.done.pop(k)
        return []

    def stream(self, timeout: float | None = None) -> Iterator[Sample]:
        """``RolloutBackend.stream``: finished samples as they come, until nothing is under way (or
        ``timeout`` seconds pass without one)."""
        last = time.monotonic()
        while True:
            out = self._take()
            if out:
                last = time.monotonic()
                yield from out
                continue
            with self.lock:
                idle = self.live == 0 and not any(k not in self.claimed for k in self.done)
            if idle:
                return
            if timeout is not None and time.monotonic() - last > timeout:
                return
            self.pump()

    def generate(
        self, requests: Sequence[GenerationRequest], submit: Callable[[Sequence[GenerationRequest]], None]
    ) -> list[Sample]:
        """``RolloutBackend.generate``: ``submit`` the requests and wait for exactly their samples."""
        wanted = [(r.request_id, i) for r in requests for i in range(r.sampling.n)]
        if len(set(wanted)) != len(wanted):
            raise ValueError("generate(): request ids must be unique")
        with self.lock:
            self.claimed.update(wanted)
        try:
            submit(requests)
            while True:
                with self.lock:
                    if all(k in self.done for k in wanted):
                        return [s for k in wanted for s in self.done.pop(k)]
                self.pump()
        finally:
            with self.lock:
                self.claimed.difference_update(wanted)

    def num_pending(self) -> int:
        with self.lock:
            return self.live + sum(1 for k in self.done if k not in self.claimed)


class OverEngine:
    """The :class:`~rlzoo.kernel.protocols.RolloutBackend` methods of a rollout composed over an engine
    (:class:`~rlzoo.agents.rollout.MultiTurnRollout`, :class:`~rlzoo.gateway.rollout.GatewayRollout`):
    batches from its :class:`Finished` ledger, weights and pauses to the engine ``inner``. The
    subclass starts trajectories in ``submit`` and shuts down."""

    inner: RolloutBackend
    _finished: Finished

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        raise NotImplementedError

    @property
    def version(self) -> int:
        return self.inner.version

    def stream(self, timeout: float | None = None) -> Iterator[Sample]:
        return self._finished.stream(timeout)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Sample]:
        return self._finished.generate(requests, self.submit)

    def pause(self) -> None:
        self.inner.pause()

    def resume(self) -> None:
        self.inner.resume()

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        self.inner.update_weights(named_tensors, version)

    def num_pending(self) -> int:
        return self._finished.num_pending()
