"""Reading series out of ``metrics.jsonl`` records, and smoothing them for the plots."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Sequence
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.report.panels import Panel, Records


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def metric_keys(records: Records) -> list[str]:
    """Every key with at least one numeric value, in first-seen order (``step``/``time`` excluded)."""
    seen: dict[str, None] = {}
    for r in records:
        for k, v in r.items():
            if k not in ("step", "time") and _numeric(v):
                seen.setdefault(k, None)
    return list(seen)


def match(keys: Iterable[str], patterns: Sequence[str], exclude: Sequence[str] = ()) -> list[str]:
    """Keys matching any pattern, in pattern order (a key appears once)."""
    keys = list(keys)
    out: dict[str, None] = {}
    for pat in patterns:
        for k in keys:
            if fnmatch.fnmatchcase(k, pat) and not any(fnmatch.fnmatchcase(k, e) for e in exclude):
                out.setdefault(k, None)
    return list(out)


def series(records: Records, key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of one metric over the records that have a finite value for it.

    A step logged twice (a resumed run repeats the steps after its last checkpoint) keeps its
    last value.
    """
    by_step: dict[int, float] = {}
    for r in records:
        v = r.get(key)
        if _numeric(v) and "step" in r:
            by_step[int(r["step"])] = float(v)  # type: ignore[arg-type]
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


# ---------------------------------------------------------------------------------------------
# smoothing
# ---------------------------------------------------------------------------------------------
#: series shorter than this are drawn as they are (with markers): nothing to smooth
MIN_POINTS_TO_SMOOTH = 30


def auto_smooth(n: int) -> float:
    """The EMA weight for a series of ``n`` points: none below 30 points, then about a 10-point
    window (weight 1 - 10 / n), at most 0.95 (a ~20-step window) for long runs."""
    if n < MIN_POINTS_TO_SMOOTH:
        return 0.0
    return min(0.95, max(0.0, 1.0 - 10.0 / n))


def ema(values: Sequence[float], weight: float) -> list[float]:
    """Debiased exponential moving average (as TensorBoard's smoothing): ``weight`` in [0, 1)."""
    if not 0.0 <= weight < 1.0:
        raise RlzooError(f"smoothing weight must be in [0, 1), got {weight}")
    out, acc = [], 0.0
    for i, v in enumerate(values, start=1):
        acc = acc * weight + (1.0 - weight) * v
        out.append(acc / (1.0 - weight**i) if weight > 0 else v)
    return out


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def rolling_window(n: int) -> int:
    """The rolling-mean window for ``n`` points: ~1/40 of the run, at least 5 steps."""
    return max(5, n // 40)


def smoothed(
    panel: Panel, values: Sequence[float], weight: float | None, n: int | None = None
) -> list[float] | None:
    """The smoothed series drawn over the faint raw one; None when the series is left raw.

    ``n``: the series length that sets the automatic window (default ``len(values)``); runs drawn
    together pass their longest, so one window smooths them all and equal runs stay equal.
    """
    n = len(values) if n is None else n
    if n < MIN_POINTS_TO_SMOOTH or weight == 0.0:
        return None
    if panel.smoothing == "rolling":
        return rolling_mean(values, rolling_window(n))
    return ema(values, auto_smooth(n) if weight is None else weight)


def _label(key: str) -> str:
    return key.removeprefix("timing_s/")
