"""The ``geo3k`` scorer (verl's convention): boxed-answer accuracy plus a ``<think>`` format term."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...scorers import Geo3KParams, MathParams
from .math_answer import math_equal

FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(response: str) -> float:
    """1.0 when the whole response matches ``<think>...</think>...\\boxed{...}...``, else 0.0."""
    return 1.0 if FORMAT.fullmatch(response) else 0.0


def compute_score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: Geo3KParams
) -> dict[str, Any]:
    """``(1 - format_weight) * acc + format_weight * format``; returns score, acc, format, pred."""
    w = float(params.format_weight)
    # the boxed answer only (or, use_boxed=False, the whole response), floats to 6 places, strict
    grading = MathParams(
        timeout=params.timeout,
        require_boxed=params.use_boxed,
        fallback_chars=0,
        float_rounding=6,
        strict=True,
    )
    correct, _, pred = math_equal(ground_truth, response, grading)
    fmt = format_reward(response)
    acc = 1.0 if correct else 0.0
    return {"score": (1.0 - w) * acc + w * fmt, "acc": correct, "format": fmt, "pred": pred}
