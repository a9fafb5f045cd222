"""Reward managers: score decoded samples with a bound scorer and turn the verdicts into rewards.

Each manager class is its own factory, ``Manager(params, scorer)``, and is called with a
sequence of :class:`rlzoo.protocols.RewardItem`, returning one :class:`RewardResult` each. A
scorer that raises, times out, or returns NaN / inf / a non-number yields a failed result
(``failed=True``, ``reward=params.failure_reward``, ``info["error"]``); the batch goes on.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import importlib
import math
import multiprocessing
import os
import pickle
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


def score_item(scorer: BoundScorerFn, item: RewardItem, failure_reward: float) -> RewardResult:
    """Score one item; a raising scorer gives a failed result."""
    try:
        raw = scorer(item.response, item.ground_truth, item.data_source, item.extra_info)
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
        self.failure_reward = float(getattr(params, "failure_reward", 0.0))

    def __call__(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        return [score_item(self.scorer, item, self.failure_reward) for item in items]


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
        self.enable = bool(getattr(params, "enable", True))
        self.buffer_len = int(getattr(params, "overlong_buffer_len", 0))
        self.penalty_factor = float(getattr(params, "penalty_factor", 1.0))
        self.max_response_length = int(getattr(params, "max_response_length", 0))
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
        except Exception:
            return [self._one(item) for item in items]
        return [to_result(raw, self.failure_reward) for raw in raws]

    def _call(self, items: Sequence[RewardItem]) -> list[Any]:
        batched: Any = self.scorer  # takes and returns lists
        raws = batched(
            [it.response for it in items],
            [it.ground_truth for it in items],
            [it.data_source for it in items],
            [it.extra_info for it in items],
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
        self.timeout = float(getattr(params, "timeout", 10.0))
        workers = int(getattr(params, "num_workers", 4))
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
        results: list[RewardResult | None] = [None] * len(items)
        queue: deque[tuple[int, int]] = deque((i, 0) for i in range(len(items)))  # (index, crashes)
        running: dict[cf.Future[Any], tuple[int, int, float]] = {}  # future -> (index, crashes, t0)

        while queue or running:
            pool = self._ensure_pool()
            isolate = any(c for _, c in queue) or any(c for _, c, _ in running.values())
            limit = 1 if isolate else self.num_workers
            while queue and len(running) < limit:
                i, crashes = queue.popleft()
                it = items[i]
                fut = pool.submit(
                    _score_in_worker, self.scorer, it.response, it.ground_truth, it.data_source, it.extra_info
                )
                running[fut] = (i, crashes, time.monotonic())

            next_deadline = min(t0 for _, _, t0 in running.values()) + self.timeout
            done, _ = cf.wait(
                list(running),
                timeout=max(0.0, next_deadline - time.monotonic()),
                return_when=cf.FIRST_COMPLETED,
            )
            broken = False
            for fut in done:
                i, crashes, _ = running.pop(fut)
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

            now = time.monotonic()
            late = [f for f, (_, _, t0) in running.items() if now - t0 >= self.timeout]
            for fut in late:
                i, _, _ = running.pop(fut)
                results[i] = failed_result(f"timed out after {self.timeout:g} s", self.failure_reward)
            if broken or late:
                # the pool is going away: everything still in flight runs again in the new one
                for i, crashes, _ in running.values():
                    queue.appendleft((i, crashes + 1 if broken else crashes))
                running.clear()
                self._kill_pool()
                self.restarts += 1

        return [r if r is not None else failed_result("not scored", self.failure_reward) for r in results]
