"""Loud reward failures: count failed samples per step, log each distinct error once, abort a run
whose scorer fails on (nearly) everything.

The training loop records every scored batch (:meth:`RewardFailures.record`, thread-safe: the
fully-async Rollouter scores in its own thread) and closes each trainer step with
:meth:`RewardFailures.end_step` (the step's metrics), then :meth:`RewardFailures.check`, which
raises :class:`RewardFailureError` when at least ``max_frac`` of the samples scored in each of
``limit`` consecutive steps failed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from rlzoo.kernel.errors import RlzooError
from rlzoo.kernel.protocols import RewardResult

logger = logging.getLogger("rlzoo")

#: distinct error texts logged per run; later new ones are counted, not printed
MAX_LOGGED_ERRORS = 20


class RewardFailureError(RlzooError):
    """(Nearly) every sample failed scoring in too many consecutive steps."""


class RewardFailures:
    """Per-step failure counts, the first text of each distinct error, and the abort rule.

    Args:
        limit: abort when ``max_frac`` of the samples scored in this many consecutive steps failed
            (0: never).
        max_frac: the failed share of a step's scored samples that counts it toward ``limit``
            (1.0: only a step in which every sample failed).
    """

    def __init__(self, limit: int, max_frac: float = 1.0) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if not 0 < max_frac <= 1:
            raise ValueError(f"max_frac must be in (0, 1], got {max_frac}")
        self.limit = limit
        self.max_frac = max_frac
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._step_scored = 0
        self._step_failed = 0
        self._last_error: str | None = None
        self.streak = 0  # consecutive steps in which at least max_frac of the scored samples failed
        self._streak_frac = 1.0  # the lowest failed share in the current streak
        self.total_failed = 0
        self._step = 0

    def record(self, results: Sequence[RewardResult]) -> None:
        """Count one scored batch; log the first occurrence of each distinct error text."""
        new: list[str] = []
        with self._lock:
            self._step_scored += len(results)
            for r in results:
                if not r.failed:
                    continue
                self._step_failed += 1
                self.total_failed += 1
                error = str(r.info.get("error", "the scorer's result was not a finite number"))
                self._last_error = error
                if error not in self._seen and len(self._seen) < MAX_LOGGED_ERRORS:
                    self._seen.add(error)
                    new.append(error)
                    if len(self._seen) == MAX_LOGGED_ERRORS:
                        new.append(
                            "(further distinct reward errors are counted in reward/failed, not logged)"
                        )
        for error in new:
            logger.warning("reward: a sample failed scoring: %s", error)

    def end_step(self, step: int) -> dict[str, float]:
        """Close ``step``: the share of the samples scored since the previous step that failed
        (``reward/failed_frac``) and the count of failing steps in a row (``reward/failed_streak``: at least ``max_frac`` failed).
        Call :meth:`check` after logging them."""
        with self._lock:
            scored, failed = self._step_scored, self._step_failed
            self._step_scored = self._step_failed = 0
        if scored:
            frac = failed / scored
            if frac >= self.max_frac:
                self._streak_frac = min(self._streak_frac, frac) if self.streak else frac
                self.streak += 1
            else:
                self.streak = 0
        self._step = step
        return {
            "reward/failed_frac": failed / scored if scored else 0.0,
            "reward/failed_streak": float(self.streak),
        }

    def check(self) -> None:
        """Raise :class:`RewardFailureError` once ``limit`` steps in a row had ``max_frac`` of their
        samples fail."""
        if self.limit and self.streak >= self.limit:
            share = (
                "every sample"
                if self._streak_frac >= 1.0
                else f"at least {self._streak_frac:.0%} of the samples (reward.max_failed_frac={self.max_frac:g})"
            )
            raise RewardFailureError(
                f"{share} failed scoring in {self.streak} consecutive steps (up to step {self._step}; "
                f"limit reward.max_failed_steps={self.limit}); the scorer's last error: {self._last_error}"
            )
