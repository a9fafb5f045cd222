"""Reward managers: score decoded samples with a bound scorer and turn the verdicts into rewards.

Each manager class is its own factory, ``Manager(params, scorer)``, and is called with a
sequence of :class:`rlzoo.kernel.protocols.RewardItem`, returning one :class:`RewardResult` each. A
scorer that raises, times out, or returns NaN / inf / a non-number yields a failed result
(``failed=True``, ``reward=params.failure_reward``, ``info["error"]``); the batch goes on.
Every manager bounds a scorer's time: ``timeout`` seconds per sample in the caller's process
(``naive``, ``dapo``, ``batch``: the scorer runs in a helper thread that is abandoned when late),
and for the whole batch in parallel in ``process_pool`` (late workers are killed).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import connection as mp_connection
from numbers import Real
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rlzoo.kernel.errors import raise_problems
from rlzoo.kernel.protocols import RewardItem, RewardResult

from ..reward import DAPOParams, ProcessPoolParams

if TYPE_CHECKING:
    from rlzoo.kernel.registry import Component

#: the largest finite float32: rewards travel in float32 tensors, so a score beyond it is a failure
FLOAT32_MAX = 3.4028234663852886e38

BoundScorerFn = Callable[[str, Any, str, Mapping[str, Any]], Any]


# ---------------------------------------------------------------------------------------------
# binding a scorer to its params (picklable)
# ---------------------------------------------------------------------------------------------
class BoundScorer:
    """A scorer with its params bound: ``bound(response, ground_truth, data_source, extra_info)``.

    ``target`` is the registered part: a ``"module:attr"`` string (imported on first call, and
    again in each worker process after unpickling) or a module-level function. Pickles as
    ``(target, params, capabilities)``, so it can be sent to ``process_pool`` workers. With the
    ``batched`` capability the call takes and returns lists.
    """

    def __init__(
        self,
        target: str | Callable[..., Any],
        params: object = None,
        capabilities: Mapping[str, Any] | None = None,
    ) -> None:
        self.target = target
        self.params = params
        self.capabilities = dict(capabilities or {})
        self._fn: Callable[..., Any] | None = None if isinstance(target, str) else target

    @classmethod
    def from_component(cls, component: Component[Any], params: object = None) -> BoundScorer:
        """Bind a registered scorer (:class:`rlzoo.kernel.registry.Component`); params default to its defaults."""
        return cls(
            component.target,
            component.default_params() if params is None else params,
            component.capabilities,
        )

    @property
    def batched(self) -> bool:
        return bool(self.capabilities.get("batched", False))

    def load(self) -> Callable[..., Any]:
        """The scorer function itself (imported on first use)."""
        if self._fn is None:
            module, _, attr = str(self.target).partition(":")
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
            self._fn = obj
        return self._fn

    def __call__(self, response: Any, ground_truth: Any, data_source: Any, extra_info: Any) -> Any:
        return self.load()(response, ground_truth, data_source, extra_info, self.params)

    def __getstate__(self) -> dict[str, Any]:
        return {"target": self.target, "params": self.params, "capabilities": self.capabilities}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["target"], state["params"], state["capabilities"])

    def __repr__(self) -> str:
        return f"BoundScorer({self.target!r}, {self.params!r})"


@runtime_checkable
class BatchedScorer(Protocol):
    """A scorer that says whether it takes and returns whole lists (:class:`BoundScorer` does, from
    its ``batched`` capability); ``batch`` calls one that says True once per batch."""

    @property
    def batched(self) -> bool: ...


def _is_batched(scorer: object) -> bool:
    return isinstance(scorer, BatchedScorer) and scorer.batched is True


# ---------------------------------------------------------------------------------------------
# one verdict -> one result
# ---------------------------------------------------------------------------------------------
def _as_number(value: Any) -> float:
    """``value`` as a finite float; ValueError for NaN, inf and non-numbers."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, Real):
        try:  # numpy / torch scalars
            value = value.item()
        except AttributeError:
            raise ValueError(f"scorer returned {type(value).__name__} {value!r}, not a number") from None
        if not isinstance(value, Real):
            raise ValueError(f"scorer returned {type(value).__name__} {value!r}, not a number")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"scorer returned a non-finite score {out!r}")
    if abs(out) > FLOAT32_MAX:
        raise ValueError(
            f"scorer returned {out!r}, beyond the float32 range (+-{FLOAT32_MAX:.4g}) of the reward tensor"
        )
    return out


def to_result(raw: Any, failure_reward: float) -> RewardResult:
    """A scorer's return value (float or dict with ``score``) as a :class:`RewardResult`."""
    try:
        if isinstance(raw, Mapping):
            if "score" not in raw:
                raise ValueError(f"scorer returned a dict without 'score' (keys: {sorted(raw)})")
            score = _as_number(raw["score"])
            info = {k: v for k, v in raw.items() if k != "score"}
        else:
            score, info = _as_number(raw), {}
    except ValueError as e:
        return failed_result(str(e), failure_reward)
    return RewardResult(reward=score, score=score, info=info)


def failed_result(error: str, failure_reward: float) -> RewardResult:
    """A failed sample: ``reward = score = failure_reward``, the error in ``info``."""
    return RewardResult(reward=failure_reward, score=failure_reward, failed=True, info={"error": error})


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class ScorerTimeout(TimeoutError):
    """A scorer call ran past its ``timeout``."""


def call_with_timeout(fn: Callable[[], Any], timeout: float | None) -> Any:
    """``fn()``, or :class:`ScorerTimeout` after ``timeout`` seconds (None: no limit, in this thread).

    The call runs in a daemon helper thread; a late one is abandoned, not stopped (Python cannot
    stop a thread), so a scorer that hangs for ever keeps its thread: ``process_pool`` kills
    hanging scorers instead. A scorer's own signal-based timeout (math-verify) needs the main
    thread and is off in the helper thread; this timeout stands in for it.
    """
    if timeout is None:
        return fn()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    t = threading.Thread(target=run, name="rlzoo-scorer", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise ScorerTimeout(
            f"the scorer timed out after {timeout:g} s (reward.manager.timeout; its thread was abandoned)"
        )
    if "error" in box:
        raise box["error"]
    return box["value"]


#: helper threads of :func:`call_each_with_timeout`, over all managers, that may stay stuck in calls
#: that ran late (Python cannot stop a thread); beyond it no new thread starts and the calls fail
#: without running (process_pool kills hung scorers instead)
MAX_STUCK_THREADS = 64
_stuck: set[_Runner] = set()
_stuck_lock = threading.Lock()


def stuck_threads() -> int:
    """How many scorer helper threads are still stuck in calls that ran past their timeout."""
    with _stuck_lock:
        return len(_stuck)


class _Runner:
    """One helper thread of :func:`call_each_with_timeout`: takes the next call off the shared
    queue, runs it, records its outcome, and takes the next, until the queue is empty or the caller
    abandons it (its call ran late; Python cannot stop a thread, so it is left to finish alone and
    counted in :func:`stuck_threads` until it does)."""

    def __init__(self, calls: _Calls) -> None:
        self.calls = calls
        self.index = -1  # the call in progress (-1: none)
        self.started_at = 0.0
        self.abandoned = False
        threading.Thread(target=self._run, name="rlzoo-scorer", daemon=True).start()

    def abandon(self) -> None:
        self.abandoned = True
        with _stuck_lock:
            _stuck.add(self)

    def _run(self) -> None:
        calls = self.calls
        while True:
            with calls.cv:
                if self.abandoned or not calls.todo:
                    calls.runners.discard(self)
                    calls.cv.notify_all()
                    return
                i = self.index = calls.todo.popleft()
                self.started_at = time.monotonic()
                calls.cv.notify_all()  # the caller's next deadline moved
            try:
                out: tuple[bool, Any] = (True, calls.fns[i]())
            except BaseException as e:  # handed to the caller
                out = (False, e)
            with calls.cv:
                if self.abandoned:
                    with _stuck_lock:
                        _stuck.discard(self)
                    return
                calls.outcomes[i] = out
                calls.finished += 1
                self.index = -1
                calls.cv.notify_all()


class _Calls:
    """The shared state of one :func:`call_each_with_timeout`: the queue, the outcomes, the runners."""

    def __init__(self, fns: Sequence[Callable[[], Any]]) -> None:
        self.fns = fns
        self.todo: deque[int] = deque(range(len(fns)))
        self.outcomes: dict[int, tuple[bool, Any]] = {}
        self.runners: set[_Runner] = set()
        self.finished = 0  # calls that returned or raised (not timed out)
        self.cv = threading.Condition()

    def start_runner(self) -> bool:
        if stuck_threads() >= MAX_STUCK_THREADS:
            return False
        self.runners.add(_Runner(self))
        return True

    def fail_todo(self, error: BaseException) -> None:
        while self.todo:
            self.outcomes[self.todo.popleft()] = (False, error)


class ScorerNotRun(RuntimeError):
    """A sample was not scored: the scorer hung on the calls before it (see the message)."""


#: the fewest calls in a row that must time out before :func:`hang_breaker` gives up on a batch
MIN_HANG_BREAKER = 4


def hang_breaker(concurrency: int) -> int:
    """Calls in a row that must time out, none finishing in between, before the rest of a batch is
    failed without being scored: as many as run at once (threads or worker processes), so with
    every worker hung the batch costs about one timeout; at least :data:`MIN_HANG_BREAKER`, so a
    few hanging samples in a small pool do not fail the batch around them."""
    return max(int(concurrency), MIN_HANG_BREAKER)


def call_each_with_timeout(
    fns: Sequence[Callable[[], Any]],
    timeout: float | None,
    threads: int = 1,
    setting: str = "reward.manager.timeout",
) -> list[tuple[bool, Any]]:
    """``(True, fn())`` or ``(False, exception)`` for each of ``fns``; a call that runs past
    ``timeout`` seconds (its own clock, from when a thread takes it) gives ``(False, ScorerTimeout)``
    naming the limit and its ``setting``.

    Up to ``threads`` daemon helper threads take the calls off one queue (None timeout: all in this
    thread, one after another), so a batch costs a few thread hand-offs rather than one per call,
    and late calls overlap: 8 hanging calls with a 1 s timeout and 8 threads fail after about 1 s,
    not 8 s. A late call's thread is abandoned (counted in :func:`stuck_threads` until its call
    returns) and a new thread takes its place. When :func:`hang_breaker` calls in a row ran late
    with none finishing in between (the scorer hangs on everything), the calls not yet started fail
    at once (``ScorerNotRun``): an all-hanging batch costs about one timeout, not one per
    ``threads`` samples, and leaves at most ``threads`` stuck threads. No new thread starts while
    :data:`MAX_STUCK_THREADS` are stuck; the calls left then fail without running.
    """
    if timeout is None:
        out: list[tuple[bool, Any]] = []
        for fn in fns:
            try:
                out.append((True, fn()))
            except BaseException as e:
                out.append((False, e))
        return out
    calls = _Calls(fns)
    late_error = f"the scorer timed out after {timeout:g} s ({setting}={timeout:g}; its thread was abandoned)"
    breaker = hang_breaker(min(max(threads, 1), len(fns)))
    late_in_row, finished_at_last_late, streak_from = 0, 0, 0.0
    with calls.cv:
        for _ in range(min(max(threads, 1), len(fns))):
            calls.start_runner()
        while len(calls.outcomes) < len(fns):
            now = time.monotonic()
            wait: float | None = None
            for runner in list(calls.runners):
                if runner.index < 0:
                    continue
                left = runner.started_at + timeout - now
                if left <= 0:  # late: fail its call, go on without this thread
                    runner.abandon()
                    calls.runners.discard(runner)
                    calls.outcomes[runner.index] = (False, ScorerTimeout(late_error))
                    if calls.finished != finished_at_last_late or not late_in_row:
                        late_in_row, finished_at_last_late, streak_from = 0, calls.finished, now
                    late_in_row += 1
                    if late_in_row >= breaker:
                        hung = ScorerNotRun(
                            f"not scored: the scorer timed out on {late_in_row} calls in a row "
                            f"({setting}={timeout:g}), so the rest of the batch was failed without "
                            "waiting for it"
                        )
                        calls.fail_todo(hung)
                        for other in list(calls.runners):  # started during the streak: as hung
                            if other.index >= 0 and other.started_at >= streak_from - timeout:
                                other.abandon()
                                calls.runners.discard(other)
                                calls.outcomes[other.index] = (False, hung)
                    elif calls.todo:
                        calls.start_runner()
                else:
                    wait = left if wait is None else min(wait, left)
            if calls.todo and not calls.runners:
                calls.fail_todo(
                    ScorerNotRun(
                        f"not scored: {stuck_threads()} scorer threads are stuck in calls that timed "
                        f"out ({setting}={timeout:g}), the most this process keeps "
                        f"({MAX_STUCK_THREADS}); reward.manager=process_pool kills hung scorers"
                    )
                )
            if len(calls.outcomes) < len(fns):
                calls.cv.wait(wait)
    return [calls.outcomes[i] for i in range(len(fns))]


def outcome_result(outcome: tuple[bool, Any], failure_reward: float) -> RewardResult:
    """The result of one :func:`call_each_with_timeout` outcome: the verdict, or a failed result for
    an exception. KeyboardInterrupt, SystemExit (not scoring failures) are raised again."""
    ok, value = outcome
    if ok:
        return to_result(value, failure_reward)
    if not isinstance(value, Exception):
        raise value
    out = failed_result(_describe(value), failure_reward)
    if not isinstance(value, (ScorerTimeout, ScorerNotRun)):  # the scorer's own error: where it came from
        out.info["traceback"] = "".join(traceback.format_exception(value))
    return out


# ---------------------------------------------------------------------------------------------
# managers
# ---------------------------------------------------------------------------------------------
class ScoringParams(Protocol):
    """What :class:`NaiveRewardManager` reads: the params of ``naive``, ``dapo`` and ``batch``."""

    @property
    def failure_reward(self) -> float: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def threads(self) -> int: ...


class NaiveRewardManager:
    """Call the scorer once per sample; reward = score."""

    def __init__(self, params: ScoringParams, scorer: BoundScorerFn) -> None:
        self.params = params
        self.scorer = scorer
        self.failure_reward = float(params.failure_reward)
        self.timeout: float | None = params.timeout
        self.threads = int(params.threads)

    def __call__(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        scorer = self.scorer
        calls = [
            functools.partial(scorer, it.response, it.ground_truth, it.data_source, it.extra_info)
            for it in items
        ]
        outcomes = call_each_with_timeout(calls, self.timeout, self.threads, "reward.manager.timeout")
        return [outcome_result(out, self.failure_reward) for out in outcomes]


def overlong_penalty(length: int, max_response_length: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment: ``min(-(len - (M - L)) / L * p, 0)``.

    0 for ``len <= M - L``, then linear down to ``-p`` at ``len = M`` (and below for longer).
    """
    expected_len = max_response_length - buffer_len
    exceed_len = length - expected_len
    return min(-exceed_len / buffer_len * penalty_factor, 0.0)


class DAPORewardManager(NaiveRewardManager):
    """Naive scoring plus DAPO's overlong-buffer penalty on ``item.response_length`` tokens."""

    def __init__(self, params: DAPOParams, scorer: BoundScorerFn) -> None:
        super().__init__(params, scorer)
        self.enable = bool(params.enable)
        self.buffer_len = int(params.overlong_buffer_len)
        self.penalty_factor = float(params.penalty_factor)
        self.max_response_length = int(params.max_response_length)
        problems = params.run_problems()  # also reported by rlzoo validate
        raise_problems("dapo reward manager", problems)

    def __call__(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        results = super().__call__(items)
        if not self.enable:
            return results
        for item, res in zip(items, results):
            penalty = overlong_penalty(
                item.response_length, self.max_response_length, self.buffer_len, self.penalty_factor
            )
            res.info["overlong_penalty"] = penalty
            res.info["overlong_reward"] = penalty  # verl's key
            res.info["overlong"] = penalty < 0
            if not res.failed:
                res.reward = res.score + penalty
        return results


class BatchRewardManager(NaiveRewardManager):
    """One call of a batched scorer on the whole batch; per-sample calls for other scorers."""

    def __call__(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        if not _is_batched(self.scorer):
            return super().__call__(items)
        if not items:
            return []
        try:
            raws = self._call(items)
        except ScorerTimeout as e:  # a hanging batched scorer: retrying each sample would hang again
            return [failed_result(_describe(e), self.failure_reward) for _ in items]
        except Exception:
            return [self._one(item) for item in items]
        return [to_result(raw, self.failure_reward) for raw in raws]

    def _call(self, items: Sequence[RewardItem]) -> list[Any]:
        batched: Any = self.scorer  # takes and returns lists
        raws = call_with_timeout(
            lambda: batched(
                [it.response for it in items],
                [it.ground_truth for it in items],
                [it.data_source for it in items],
                [it.extra_info for it in items],
            ),
            None if self.timeout is None else self.timeout * len(items),  # timeout per sample
        )
        raws = list(raws)
        if len(raws) != len(items):
            raise ValueError(f"batched scorer returned {len(raws)} results for {len(items)} samples")
        return raws

    def _one(self, item: RewardItem) -> RewardResult:
        try:
            (raw,) = self._call([item])
        except Exception as e:
            return failed_result(_describe(e), self.failure_reward)
        return to_result(raw, self.failure_reward)


# ---------------------------------------------------------------------------------------------
# process pool
# ---------------------------------------------------------------------------------------------
def _worker_main(conn: Any, scorer: Any) -> None:
    """A ``process_pool`` worker: load the scorer, say ``("ready", pid)``, then answer each
    ``(index, args)`` with ``(index, True, verdict)`` or ``(index, False, error text)`` (exceptions
    never cross the process boundary) until it receives None or its pipe closes."""
    load = getattr(scorer, "load", None)
    if callable(load):
        with contextlib.suppress(Exception):  # a scorer that cannot load fails on each sample instead
            load()
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        i, (response, ground_truth, data_source, extra_info) = msg
        try:
            out: tuple[int, bool, Any] = (
                i,
                True,
                scorer(response, ground_truth, data_source, dict(extra_info or {})),
            )
        except Exception as e:
            out = (i, False, (_describe(e), traceback.format_exc()))
        try:
            conn.send(out)
        except Exception as e:  # the verdict does not pickle: nothing was written yet
            conn.send((i, False, (f"the scorer's verdict could not be sent back: {_describe(e)}", None)))


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


class _Worker:
    """One worker process of ``process_pool``, its pipe, and the sample it is scoring."""

    def __init__(self, ctx: Any, scorer: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, scorer), name="rlzoo-scorer", daemon=True)
        self.proc.start()
        child.close()
        self.born = time.monotonic()
        self.ready = False
        self.task: tuple[int, int] | None = None  # (sample index, crashes so far)
        self.started_at = 0.0

    @property
    def name(self) -> str:
        return f"worker pid {self.proc.pid}"

    def stop(self, kill: bool) -> None:
        if kill:
            with contextlib.suppress(Exception):
                self.proc.kill()
        else:
            with contextlib.suppress(Exception):
                self.conn.send(None)
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        with contextlib.suppress(Exception):
            self.conn.close()


#: seconds a new worker process may take to import the scorer and say it is ready
WORKER_START_TIMEOUT = 120.0


class ProcessPoolRewardManager:
    """Score in ``num_workers`` worker processes (spawn), each sample within ``timeout`` seconds.

    A sample's clock starts when it is handed to an idle worker, so samples run in parallel and a
    late one costs only its own worker: that worker is killed, the sample fails ("timed out"),
    and a fresh worker takes its place while the others go on. A worker that dies (killed, out of
    memory, ``os._exit``) is named in the error with its pid and exit status; its sample is
    retried once on a fresh worker and fails if it kills that one too. Call :meth:`close` (or use
    it as a context manager) to stop the workers.
    """

    def __init__(self, params: ProcessPoolParams, scorer: BoundScorerFn) -> None:
        self.params = params
        self.scorer = scorer
        self.failure_reward = float(params.failure_reward)
        try:
            pickle.dumps(scorer)
        except Exception as e:
            raise TypeError(
                f"process_pool reward manager: the scorer {scorer!r} cannot be pickled ({e}); bind it "
                "with rlzoo.algorithms.functional.reward.BoundScorer('module:function', params) or use "
                "a module-level function"
            ) from e
        if params.timeout is None or params.timeout <= 0:
            raise ValueError(
                f"process_pool reward manager: timeout must be > 0 seconds, got {params.timeout}"
            )
        self.timeout = float(params.timeout)
        workers = int(params.num_workers)
        self.num_workers = workers if workers > 0 else (os.cpu_count() or 1)
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        self._reaping: list[_Worker] = []  # killed, not yet joined
        self._finished = 0
        self.restarts = 0  # workers replaced after a timeout or a death

    # -- worker lifecycle -----------------------------------------------------------------------
    def _ensure_workers(self) -> None:
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._ctx, self.scorer))

    def start(self, timeout: float = WORKER_START_TIMEOUT) -> None:
        """Start the workers and wait until each has loaded the scorer (a call does this itself)."""
        self._ensure_workers()
        deadline = time.monotonic() + timeout
        while not all(w.ready for w in self._workers) and time.monotonic() < deadline:
            self._poll(max(0.0, deadline - time.monotonic()), [], deque())

    def _replace(self, worker: _Worker, kill: bool, wait: bool = True) -> None:
        """Stop ``worker`` and start a fresh one in its place (``wait=False``: a killed worker is
        reaped without waiting for it, so replacing many hung ones costs no time)."""
        self._workers.remove(worker)
        if kill and not wait:
            with contextlib.suppress(Exception):
                worker.proc.kill()
            self._reaping.append(worker)
        else:
            worker.stop(kill=kill)
        self.restarts += 1
        self._ensure_workers()
        self._reap()

    def _reap(self) -> None:
        """Join killed workers that have exited, close their pipes."""
        left = []
        for w in self._reaping:
            if w.proc.is_alive():
                left.append(w)
                continue
            w.proc.join(timeout=0)
            with contextlib.suppress(Exception):
                w.conn.close()
        self._reaping = left

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        workers, self._workers = self._workers, []
        for w in workers:
            w.stop(kill=w.task is not None)
        for w in self._reaping:
            w.stop(kill=True)
        self._reaping = []

    def __enter__(self) -> ProcessPoolRewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            for w in self._workers:
                w.proc.kill()

    # -- scoring --------------------------------------------------------------------------------
    def __call__(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        """Score ``items``, at most ``num_workers`` at a time, each within ``timeout`` seconds of
        reaching its worker; a late or crashing sample fails alone and the rest are scored."""
        results: list[RewardResult | None] = [None] * len(items)
        queue: deque[tuple[int, int]] = deque((i, 0) for i in range(len(items)))  # (index, crashes)
        if not items:
            return []
        self._ensure_workers()
        start_failures = 0
        self._finished = 0  # samples that came back from a worker (not timed out)
        late_in_row, finished_at_last_late, streak_from = 0, 0, 0.0
        breaker = hang_breaker(min(self.num_workers, len(items)))
        while queue or any(w.task is not None for w in self._workers):
            for w in self._workers:  # hand samples to idle workers
                if w.ready and w.task is None and queue:
                    i, crashes = queue.popleft()
                    it = items[i]
                    try:
                        w.conn.send((i, (it.response, it.ground_truth, it.data_source, it.extra_info)))
                    except (BrokenPipeError, OSError):
                        queue.appendleft((i, crashes))  # never started: the death is found below
                        continue
                    except Exception as e:  # the sample does not pickle
                        results[i] = failed_result(_describe(e), self.failure_reward)
                        continue
                    w.task, w.started_at = (i, crashes), time.monotonic()
            now = time.monotonic()
            waits = [w.started_at + self.timeout - now for w in self._workers if w.task is not None]
            waits += [w.born + WORKER_START_TIMEOUT - now for w in self._workers if not w.ready]
            start_failures += self._poll(max(0.0, min(waits, default=1.0)), results, queue)
            now = time.monotonic()
            for w in list(self._workers):
                if w.task is not None and now - w.started_at >= self.timeout:
                    i, _ = w.task
                    results[i] = failed_result(
                        f"the scorer timed out after {self.timeout:g} s (reward.manager.timeout="
                        f"{self.timeout:g}, per sample; its {w.name} was killed and replaced)",
                        self.failure_reward,
                    )
                    w.task = None
                    self._replace(w, kill=True, wait=False)
                    if self._finished != finished_at_last_late or not late_in_row:
                        late_in_row, finished_at_last_late, streak_from = 0, self._finished, now
                    late_in_row += 1
                    if late_in_row >= breaker:  # every worker hung: the scorer hangs
                        hung = (
                            f"not scored: the scorer timed out on {late_in_row} samples in a row "
                            f"(reward.manager.timeout={self.timeout:g}), none finishing in between, so the rest "
                            "of the batch was failed without waiting for it"
                        )
                        for j, _ in queue:
                            results[j] = failed_result(hung, self.failure_reward)
                        queue.clear()
                        for other in list(self._workers):  # started during the streak: as hung
                            if other.task is not None and other.started_at >= streak_from - self.timeout:
                                results[other.task[0]] = failed_result(hung, self.failure_reward)
                                other.task = None
                                self._replace(other, kill=True, wait=False)
                elif not w.ready and now - w.born >= WORKER_START_TIMEOUT:
                    start_failures += 1
                    self._replace(w, kill=True)
            if start_failures >= 2 * self.num_workers and not any(w.ready for w in self._workers):
                for i, _ in queue:
                    results[i] = failed_result(
                        "process_pool's worker processes fail to start (see the log above); not scored",
                        self.failure_reward,
                    )
                queue.clear()
        return [r if r is not None else failed_result("not scored", self.failure_reward) for r in results]

    def _poll(self, timeout: float, results: list[RewardResult | None], queue: deque[tuple[int, int]]) -> int:
        """Wait up to ``timeout`` s for a verdict, a ready worker or a death; handle what came.
        Returns how many workers died before they were ready."""
        conns = {w.conn: w for w in self._workers}
        sentinels = {w.proc.sentinel: w for w in self._workers}
        got = mp_connection.wait([*conns, *sentinels], timeout=timeout)
        early_deaths = 0
        dead: list[_Worker] = []
        for obj in got:
            w = conns.get(obj)
            if w is None:
                continue
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                dead.append(w)
                continue
            if msg[0] == "ready":
                w.ready = True
                continue
            i, ok, value = msg
            if w.task is not None and w.task[0] == i:
                w.task = None
                self._finished += 1
                if ok:
                    results[i] = to_result(value, self.failure_reward)
                else:
                    error, tb = value
                    results[i] = failed_result(error, self.failure_reward)
                    if tb:
                        results[i].info["traceback"] = tb
        for obj in got:
            w = sentinels.get(obj)
            if w is not None and w not in dead and not w.conn.poll():
                dead.append(w)
        for w in dead:
            w.proc.join(timeout=5)
            if w.task is not None:
                i, crashes = w.task
                if crashes >= 1:
                    results[i] = failed_result(
                        f"the scorer's {w.name} died ({_exit_text(w.proc.exitcode)}) while scoring "
                        "this sample, twice in a row (on two workers)",
                        self.failure_reward,
                    )
                else:
                    queue.appendleft((i, crashes + 1))
                w.task = None
            elif not w.ready:
                early_deaths += 1
            self._replace(w, kill=True)
        return early_deaths
