"""The ``auto`` scorer: choose a scorer by data source, like verl's ``default_compute_score``."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from rlzoo.kernel.protocols import ScorerFn

from ...scorers import RULE_SCORERS, AutoParams

#: data_source -> scorer name (exact matches), in verl's ``default_compute_score`` spirit.
ROUTES: Mapping[str, str] = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "hiyouga/geometry3k": "geo3k",
    "geo3k": "geo3k",
    "math_dapo": "dapo_math",
    "BytedTsinghua-SIA/DAPO-Math-17k": "dapo_math",
    "BytedTsinghua-SIA/AIME-2024": "dapo_math",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    # verl routes these to prime_code / SandboxFusion; rlzoo runs their tests in its sandbox
    "codecontests": "code_tests",
    "apps": "code_tests",
    "codeforces": "code_tests",
    "taco": "code_tests",
    "rlzoo/python_functions": "code_tests",
}
#: data_source prefix -> scorer name, tried after the exact matches.
PREFIX_ROUTES: tuple[tuple[str, str], ...] = (("aime", "dapo_math"),)


def dispatch(data_source: str, routes: Mapping[str, str] | None = None, fallback: str = "math") -> str:
    """The name of the scorer for ``data_source``.

    ``routes`` (exact names) are checked first, then :data:`ROUTES`, then the prefixes in
    :data:`PREFIX_ROUTES` (``aime*``), then ``fallback``; an empty fallback raises ``KeyError``.
    """
    if routes and data_source in routes:
        return routes[data_source]
    if data_source in ROUTES:
        return ROUTES[data_source]
    for prefix, name in PREFIX_ROUTES:
        if data_source.startswith(prefix):
            return name
    if not fallback:
        known = sorted({*ROUTES, *(routes or {})})
        raise KeyError(
            f"no scorer for data_source {data_source!r}; known sources: {', '.join(known)}, "
            f"and any starting with {', '.join(p for p, _ in PREFIX_ROUTES)}. Add one with the auto "
            "scorer's 'routes' param or set its 'fallback'"
        )
    return fallback


def scorer_by_name(name: str) -> tuple[ScorerFn, object]:
    """``(fn, default params)`` of a built-in rule-based scorer (:data:`RULE_SCORERS`)."""
    if name not in RULE_SCORERS:
        raise KeyError(
            f"auto scorer: unknown scorer {name!r}; built-in scorers: {', '.join(sorted(RULE_SCORERS))}"
        )
    target, params_cls = RULE_SCORERS[name]
    module, _, attr = target.partition(":")
    fn: ScorerFn = getattr(importlib.import_module(f"rlzoo.algorithms.functional.scoring.{module}"), attr)
    return fn, params_cls()


def compute_score(
    response: str, ground_truth: Any, data_source: str, extra_info: Mapping[str, Any], params: AutoParams
) -> float | dict[str, Any]:
    """Score with the scorer :func:`dispatch` picks for ``data_source`` (its default params).

    The result dict gains ``scorer``: the name of the scorer that ran.
    """
    name = dispatch(data_source, params.routes, params.fallback)
    fn, sub_params = scorer_by_name(name)
    result = fn(response, ground_truth, data_source, extra_info, sub_params)
    if isinstance(result, dict):
        return {**result, "scorer": name}
    return {"score": float(result), "scorer": name}
