"""The ``python_file`` scorer: a scoring function from a file the user names (verl's
``custom_reward_function.path`` / ``.name`` / ``.reward_kwargs``).

:func:`~.file_check.check_function` reads the file as text when a recipe is validated.
:func:`compute_score` imports the file once per process, under a private module name, from that path
only, and calls the function with verl's keywords.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rlzoo.system.user_files import load_from_file

if TYPE_CHECKING:
    from ...scorers import PythonFileParams


def load_function(path: str, name: str) -> Callable[..., Any]:
    """The function, importing the file once per process under a private name (from that path only)."""
    fn = load_from_file(path, name, "rlzoo_user_scorer_")
    if not callable(fn):
        raise RuntimeError(f"python_file scorer: {name!r} in {path} is not a function")
    return fn  # type: ignore[no-any-return]


def compute_score(
    response: str,
    ground_truth: Any,
    data_source: str,
    extra_info: Mapping[str, Any],
    params: PythonFileParams,
) -> float | dict[str, Any]:
    fn = load_function(params.path, params.function)
    out = fn(
        data_source=data_source,
        solution_str=response,
        ground_truth=ground_truth,
        extra_info=dict(extra_info) if extra_info is not None else None,
        **params.kwargs,
    )
    if isinstance(out, Mapping):
        if "score" not in out:
            raise ValueError(f"{params.function}() returned a dict without 'score' (keys: {sorted(out)[:8]})")
        score = out["score"]
    else:
        score = out
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(float(score)):
        raise ValueError(f"{params.function}() returned score {score!r}; a finite number is needed")
    return dict(out) if isinstance(out, Mapping) else float(out)
