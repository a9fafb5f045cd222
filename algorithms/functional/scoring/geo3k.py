"""The ``geo3k`` scorer (verl's convention): boxed-answer accuracy plus a ``<think>`` format term."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rlzoo.algorithms.functional.scoring.math_answer import math_equal

FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(response: str) -> float:
    """1.0 when the whole response matches ``<think>...</think>...\\boxed{...}...``, else 0.0."""
    return 1.0 if FORMAT.fullmatch(response) else 0.0


class _Params:
    """math_equal's view of Geo3KParams: boxed only (or the whole response), no clipping."""

    def __init__(self, timeout: int, use_boxed: bool) -> None:
        self.timeout = timeout
        self.require_boxed = use_boxed
        self.fallback_chars = 0
        self.float_rounding = 6
        self.strict = True


def compute_score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: Any
) -> dict[str, Any]:
    """``(1 - format_weight) * acc + format_weight * format``; returns score, acc, format, pred."""
    w = float(getattr(params, "format_weight", 0.1))
    view = _Params(getattr(params, "timeout", 5), getattr(params, "use_boxed", True))
    correct, _, pred = math_equal(ground_truth, response, view)
    fmt = format_reward(response)
    acc = 1.0 if correct else 0.0
    return {"score": (1.0 - w) * acc + w * fmt, "acc": correct, "format": fmt, "pred": pred}
