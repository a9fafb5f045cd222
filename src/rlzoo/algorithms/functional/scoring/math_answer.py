"""The ``math`` scorer: the last ``\\boxed{}`` answer checked against the ground truth by math-verify."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from math_verify import parse, verify

from ...scorers import MathParams
from .extract import last_boxed_content


def effective_timeout(timeout: int | None) -> int | None:
    """``timeout`` in the main thread, None elsewhere: math-verify's timeout uses ``signal.alarm``."""
    if not timeout or timeout <= 0:
        return None
    return int(timeout) if threading.current_thread() is threading.main_thread() else None


def gold_latex(ground_truth: Any) -> str:
    """The ground truth as a boxed LaTeX string for ``math_verify.parse`` (boxed ones kept as is)."""
    gt = str(ground_truth).strip()
    inner = last_boxed_content(gt)
    return f"\\boxed{{{inner if inner is not None else gt}}}"


_GOLD_CACHE: dict[str, list[Any]] = {}
_GOLD_CACHE_SIZE = 4096


def _parse_gold(latex: str, timeout: int | None) -> list[Any]:
    """math-verify's parse of a ground truth, cached (only successful parses are kept)."""
    hit = _GOLD_CACHE.get(latex)
    if hit is not None:
        return hit
    parsed = parse(latex, parsing_timeout=timeout)
    if parsed:
        if len(_GOLD_CACHE) >= _GOLD_CACHE_SIZE:
            _GOLD_CACHE.pop(next(iter(_GOLD_CACHE)))
        _GOLD_CACHE[latex] = parsed
    return parsed


def parse_prediction(
    response: str, *, require_boxed: bool, fallback_chars: int, timeout: int | None
) -> tuple[list[Any], str]:
    """``(parsed, pred_text)``: math-verify's parse of the last boxed answer, else of the tail."""
    boxed = last_boxed_content(response)
    if boxed is not None:
        return parse(f"\\boxed{{{boxed}}}", parsing_timeout=timeout), boxed
    if require_boxed:
        return [], ""
    tail = response[-fallback_chars:] if fallback_chars > 0 else response
    parsed = parse(tail, parsing_timeout=timeout)
    return parsed, (str(parsed[-1]) if parsed else "")


def math_equal(ground_truth: Any, response: str, params: MathParams) -> tuple[bool, bool, str]:
    """``(correct, found, pred)`` for one response, graded as ``params`` say (``format_score``
    aside): found is whether any answer was extracted."""
    timeout_s = effective_timeout(params.timeout)
    gold = _parse_gold(gold_latex(ground_truth), timeout_s)
    pred, pred_text = parse_prediction(
        response, require_boxed=params.require_boxed, fallback_chars=params.fallback_chars, timeout=timeout_s
    )
    if not pred or not gold:
        return False, bool(pred), pred_text
    ok = verify(
        gold,
        pred,
        float_rounding=params.float_rounding,
        strict=params.strict,
        timeout_seconds=timeout_s,
    )
    return bool(ok), True, pred_text


def compute_score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: MathParams
) -> dict[str, Any]:
    """Score one response: 1.0 when math-verify says it equals the ground truth.

    A wrong extracted answer gets ``params.format_score``, no extractable answer gets 0.0.
    Returns ``{"score", "acc", "pred"}``.
    """
    correct, found, pred = math_equal(ground_truth, response, params)
    if correct:
        score = 1.0
    elif found:
        score = float(params.format_score)
    else:
        score = 0.0
    return {"score": score, "acc": correct, "pred": pred}
