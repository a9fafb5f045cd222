"""Reward managers: score decoded samples with a bound scorer and turn the verdicts into rewards.

Each manager class is its own factory, ``Manager(params, scorer)``, and is called with a
sequence of :class:`rlzoo.protocols.RewardItem`, returning one :class:`RewardResult` each. A
scorer that raises, times out, or returns NaN / inf / a non-number yields a failed result
(``failed=True``, ``reward=params.failure_reward``, ``info["error"]``); the batch goes on.
Every manager bounds a scorer's time: ``timeout`` seconds per sample in the caller's process
(``naive``, ``dapo``, ``batch``: the scorer runs in a helper thread that is abandoned when late),
and for the whole batch in parallel in ``process_pool`` (late workers are killed).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import importlib
import math
import multiprocessing
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from numbers import Real
from typing import Any

from rlzoo.protocols import RewardItem, RewardResult

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
        params: Any = None,
        capabilities: Mapping[str, Any] | None = None,
    ) -> None:
        self.target = target
        self.params = params
        self.capabilities = dict(capabilities or {})
        self._fn: Callable[..., Any] | None = None if isinstance(target, str) else target

    @classmethod
    def from_component(cls, component: Any, params: Any = None) -> BoundScorer:
        """Bind a registered scorer (:class:`rlzoo.registry.Component`); params default to its defaults."""
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
        self.__init__(state["target"], state["params"], state["capabilities"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"BoundScorer({self.target!r}, {self.params!r})"


def _is_batched(scorer: Any) -> bool:
    caps = getattr(scorer, "capabilities", None) or {}
    return bool(caps.get("batched", False) or getattr(scorer, "batched", False) is True)


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
        raise ScorerTimeout(f"timed out after {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class _SerialCalls:
    """Runs ``fns[start:]`` one after another in one daemon thread, recording each outcome.

    ``current`` is the index of the call in progress (``len(fns)`` when all are done) and
    ``started_at`` its start; both change, and ``outcomes`` grows, under ``cv``. An abandoned
    runner (its call ran late) records nothing more and stops after that call.
    """

    def __init__(self, fns: Sequence[Callable[[], Any]], start: int) -> None:
        self.fns = fns
        self.current = start
        self.started_at = time.monotonic()
        self.outcomes: dict[int, tuple[bool, Any]] = {}
        self.abandoned = False
        self.cv = threading.Condition()
        threading.Thread(target=self._run, name="rlzoo-scorer", daemon=True).start()

    def _run(self) -> None:
        i = self.current
        while i < len(self.fns):
            try:
                out: tuple[bool, Any] = (True, self.fns[i]())
            except BaseException as e:  # handed to the caller
                out = (False, e)
            with self.cv:
                if self.abandoned:
                    return
                self.outcomes[i] = out
                i += 1
                self.current, self.started_at = i, time.monotonic()
                if i == len(self.fns):
                    self.cv.notify()


def call_each_with_timeout(fns: Sequence[Callable[[], Any]], timeout: float | None) -> list[tuple[bool, Any]]:
    """``(True, fn())`` or ``(False, exception)`` for each of ``fns``, called in order; a call that
    runs past ``timeout`` seconds (its own clock) gives ``(False, ScorerTimeout)``.

    The calls run one after another in one daemon helper thread (None: no limit, in this thread),
    so a batch costs one thread hand-off rather than one per call. A late call's thread is
    abandoned, as in :func:`call_with_timeout`, and the calls after it go on in a new one.
    """
    if timeout is None:
        out: list[tuple[bool, Any]] = []
        for fn in fns:
            try:
                out.append((True, fn()))
            except BaseException as e:
                out.append((False, e))
        return out
    results: list[tuple[bool, Any]] = []
    while len(results) < len(fns):
        runner = _SerialCalls(fns, len(results))
        with runner.cv:
            while runner.current < len(fns):
                left = runner.started_at + timeout - time.monotonic()
                if left <= 0:  # call runner.current is late: fail it, go on without this thread
                    runner.abandoned = True
                    break
                runner.cv.wait(left)
            done = sorted(runner.outcomes.items())
        results += [out for _, out in done]
        if len(results) < len(fns):
            results.append((False, ScorerTimeout(f"timed out after {timeout:g} s")))
    return results


def score_item(
    scorer: BoundScorerFn, item: RewardItem, failure_reward: float, timeout: float | None = None
) -> RewardResult:
    """Score one item within ``timeout`` seconds; a raising or late scorer gives a failed result."""
    try:
        raw = call_with_timeout(
            lambda: scorer(item.response, item.ground_truth, item.data_source, item.extra_info), timeout
        )
    except Exception as e:
        return failed_result(_describe(e), failure_reward)
    return to_result(raw, failure_reward)


# ---------------------------------------------------------------------------------------------
# managers
# ---------------------------------------------------------------------------------------------
class NaiveRewardManager:
    """Call the scorer once per sample; reward = score."""

    def __init__(self, params: Any, scorer: BoundScorerFn) -> None:
        self.params = params
        self.scorer = scorer
        self.failure_reward = float(params.failure_reward)
        self.timeout: float | None = params.timeout

    def __call__(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        scorer = self.scorer
        calls = [
            functools.partial(scorer, it.response, it.ground_truth, it.data_source, it.extra_info)
            for it in items
        ]
        return [self._result(out) for out in call_each_with_timeout(calls, self.timeout)]

    def _result(self, outcome: tuple[bool, Any]) -> RewardResult:
        ok, value = outcome
        if ok:
            return to_result(value, self.failure_reward)
        if not isinstance(value, Exception):  # KeyboardInterrupt, SystemExit: not a scoring failure
            raise value
        return failed_result(_describe(value), self.failure_reward)


def overlong_penalty(length: int, max_response_length: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment: ``min(-(len - (M - L)) / L * p, 0)``.

    0 for ``len <= M - L``, then linear down to ``-p`` at ``len = M`` (and below for longer).
    """
    expected_len = max_response_length - buffer_len
    exceed_len = length - expected_len
    return min(-exceed_len / buffer_len * penalty_factor, 0.0)


class DAPORewardManager(NaiveRewardManager):
    """Naive scoring plus DAPO's overlong-buffer penalty on ``item.response_length`` tokens."""

    def __init__(self, params: Any, scorer: BoundScorerFn) -> None:
        super().__init__(params, scorer)
        self.enable = bool(params.enable)
        self.buffer_len = int(params.overlong_buffer_len)
        self.penalty_factor = float(params.penalty_factor)
        self.max_response_length = int(params.max_response_length)
        if self.enable:
            if self.max_response_length <= 0:
                raise ValueError(
                    "dapo reward manager: max_response_length must be set (the rollout's max response "
                    "tokens) when the overlong buffer is enabled"
                )
            if not 0 < self.buffer_len <= self.max_response_length:
                raise ValueError(
                    f"dapo reward manager: overlong_buffer_len ({self.buffer_len}) must be in "
                    f"(0, max_response_length={self.max_response_length}]"
                )

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
def _warm_worker(scorer: Any) -> int:
    """Runs once per worker at pool start: imports the scorer so that timing starts warm."""
    load = getattr(scorer, "load", None)
    if callable(load):
        load()
    time.sleep(0.05)  # let the other workers take the other warm-up tasks
    return os.getpid()


def _score_in_worker(
    scorer: Any, response: str, ground_truth: Any, data_source: str, extra_info: Any
) -> tuple[bool, Any]:
    """``(True, verdict)`` or ``(False, error text)``: exceptions never cross the process boundary."""
    try:
        return True, scorer(response, ground_truth, data_source, dict(extra_info or {}))
    except Exception as e:
        return False, _describe(e)


class ProcessPoolRewardManager(NaiveRewardManager):
    """Score in worker processes (spawn) with a per-sample timeout; the pool survives bad samples.

    At most ``num_workers`` samples are in flight, so a sample's clock starts when it is handed
    to an idle worker. On a timeout the pool's workers are killed and a new pool started; the
    samples in flight beside the slow one are rerun. When a worker dies (BrokenProcessPool) the
    samples then in flight are rerun one at a time; one that breaks the pool again is failed.
    Call :meth:`close` (or use it as a context manager) to stop the workers.
    """

    def __init__(self, params: Any, scorer: BoundScorerFn) -> None:
        super().__init__(params, scorer)
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
        self._pool: cf.ProcessPoolExecutor | None = None
        self.restarts = 0  # pools replaced after a timeout or a dead worker

    # -- pool lifecycle -------------------------------------------------------------------------
    def _ensure_pool(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            pool = cf.ProcessPoolExecutor(max_workers=self.num_workers, mp_context=ctx)
            warm = [pool.submit(_warm_worker, self.scorer) for _ in range(self.num_workers)]
            cf.wait(warm, timeout=120)
            self._pool = pool
        return self._pool

    def _kill_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for p in procs:
            if p.is_alive():
                p.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.join(timeout=5)

    def close(self) -> None:
        """Stop the worker processes (a later call starts a new pool)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ProcessPoolRewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._kill_pool()

    # -- scoring --------------------------------------------------------------------------------
    def __call__(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        """Score ``items`` within ``timeout`` seconds for the whole batch: every sample's clock runs
        from the start of the call, in parallel; what is not scored by then (running or still
        queued) fails, and the late workers are killed once (a new pool serves the next call)."""
        results: list[RewardResult | None] = [None] * len(items)
        queue: deque[tuple[int, int]] = deque((i, 0) for i in range(len(items)))  # (index, crashes)
        running: dict[cf.Future[Any], tuple[int, int]] = {}  # future -> (index, crashes)
        if items:
            self._ensure_pool()
        deadline = time.monotonic() + self.timeout

        while (queue or running) and time.monotonic() < deadline:
            pool = self._ensure_pool()
            isolate = any(c for _, c in queue) or any(c for _, c in running.values())
            limit = 1 if isolate else self.num_workers
            while queue and len(running) < limit:
                i, crashes = queue.popleft()
                it = items[i]
                fut = pool.submit(
                    _score_in_worker, self.scorer, it.response, it.ground_truth, it.data_source, it.extra_info
                )
                running[fut] = (i, crashes)

            done, _ = cf.wait(
                list(running),
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=cf.FIRST_COMPLETED,
            )
            broken = False
            for fut in done:
                i, crashes = running.pop(fut)
                try:
                    ok, value = fut.result()
                except BrokenProcessPool:
                    broken = True
                    if crashes >= 1:
                        results[i] = failed_result("the scorer's worker process died", self.failure_reward)
                    else:
                        queue.append((i, crashes + 1))
                    continue
                except Exception as e:  # e.g. the verdict could not be pickled back
                    results[i] = failed_result(_describe(e), self.failure_reward)
                    continue
                results[i] = (
                    to_result(value, self.failure_reward) if ok else failed_result(value, self.failure_reward)
                )
            if broken:
                # the pool is going away: everything still in flight runs again in the new one
                for i, crashes in running.values():
                    queue.appendleft((i, crashes + 1))
                running.clear()
                self._kill_pool()
                self.restarts += 1

        late = [i for i, _ in running.values()] + [i for i, _ in queue]
        for i in late:
            results[i] = failed_result(
                f"timed out after {self.timeout:g} s (process_pool's limit for the whole batch)",
                self.failure_reward,
            )
        if running:
            self._kill_pool()
            self.restarts += 1
        return [r if r is not None else failed_result("not scored", self.failure_reward) for r in results]
