"""Loud reward failures: count failed samples per step, log each distinct error once, abort a run
whose scorer fails on everything.

The training loop records every scored batch (:meth:`RewardFailures.record`, thread-safe: the
fully-async Rollouter scores in its own thread) and closes each trainer step with
:meth:`RewardFailures.end_step` (the step's metrics), then :meth:`RewardFailures.check`, which
raises :class:`RewardFailureError` when every sample scored in ``limit`` consecutive steps failed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from rlzoo.errors import RlzooError
from rlzoo.protocols import RewardResult

logger = logging.getLogger("rlzoo")

#: distinct error texts logged per run; later new ones are counted, not printed
MAX_LOGGED_ERRORS = 20


class RewardFailureError(RlzooError):
    """Every sample failed scoring in too many consecutive steps."""


class RewardFailures:
    """Per-step failure counts, the first text of each distinct error, and the abort rule.

    Args:
        limit: abort when every sample scored in this many consecutive steps failed (0: never).
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._step_scored = 0
        self._step_failed = 0
        self._last_error: str | None = None
        self.streak = 0  # consecutive steps in which every scored sample failed
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
        (``reward/failed_frac``) and the count of all-failed steps in a row (``reward/failed_streak``).
        Call :meth:`check` after logging them."""
        with self._lock:
            scored, failed = self._step_scored, self._step_failed
            self._step_scored = self._step_failed = 0
        if scored:
            self.streak = self.streak + 1 if failed == scored else 0
        self._step = step
        return {
            "reward/failed_frac": failed / scored if scored else 0.0,
            "reward/failed_streak": float(self.streak),
        }

    def check(self) -> None:
        """Raise :class:`RewardFailureError` once ``limit`` steps in a row had every sample fail."""
        if self.limit and self.streak >= self.limit:
            raise RewardFailureError(
                f"every sample failed scoring in {self.streak} consecutive steps (up to step {self._step}; "
                f"limit reward.max_failed_steps={self.limit}); the scorer's last error: {self._last_error}"
            )
