"""The ``gsm8k`` scorer (verl's convention): the number after ``####`` or the last number."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...scorers import GSM8KParams

CLIP_CHARS = 300  # verl: only the tail is searched (regexes over long strings are slow)
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def _clean(number: str) -> str:
    return number.replace(",", "").replace("$", "")


def extract_solution(response: str, method: str = "strict") -> str | None:
    """The answer string, or None: ``strict`` wants ``#### <number>``, ``flexible`` the last number.

    ``flexible`` skips matches that are only punctuation (``"."``, ``","``) and drops a trailing
    full stop (``"... is 18."`` gives ``"18"``), which verl's version keeps.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    text = response[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(text)
        return _clean(found[-1]) if found else None
    for candidate in reversed(_NUMBER.findall(text)):
        cleaned = _clean(candidate).rstrip(".")
        if cleaned not in ("", "-"):
            return cleaned
    return None


def compute_score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: GSM8KParams
) -> dict[str, Any]:
    """``params.score`` when the extracted number equals the ground truth (as strings).

    A wrong number gets ``params.format_score``; no number gets 0.0. Returns
    ``{"score", "acc", "pred"}``.
    """
    pred = extract_solution(response, params.method)
    if pred is None:
        return {"score": 0.0, "acc": False, "pred": ""}
    correct = pred == _clean(str(ground_truth).strip())
    score = params.score if correct else params.format_score
    return {"score": float(score), "acc": correct, "pred": pred}
