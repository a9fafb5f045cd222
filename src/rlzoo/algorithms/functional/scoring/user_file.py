"""The ``python_file`` scorer: a scoring function from a file the user names (verl's
``custom_reward_function.path`` / ``.name`` / ``.reward_kwargs``).

:func:`~.file_check.check_function` reads the file as text when a recipe is validated.
:func:`compute_score` imports the file once per process, under a private module name, from that path
only, and calls the function with verl's keywords.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...scorers import PythonFileParams

_loaded: dict[tuple[str, str], Callable[..., Any]] = {}
_lock = threading.Lock()


def load_function(path: str, name: str) -> Callable[..., Any]:
    """The function, importing the file once per process under a private name (from that path only)."""
    file = str(Path(path).expanduser().resolve())
    key = (file, name)
    with _lock:
        if key not in _loaded:
            module_name = "rlzoo_user_scorer_" + hashlib.sha1(file.encode()).hexdigest()[:12]
            spec = importlib.util.spec_from_file_location(module_name, file)
            if spec is None or spec.loader is None:
                raise RuntimeError(f"python_file scorer: cannot import {file}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module  # pickling and dataclasses in the file need it registered
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(module_name, None)
                raise
            fn = getattr(module, name, None)
            if not callable(fn):
                raise RuntimeError(f"python_file scorer: {file} has no function {name!r} after import")
            _loaded[key] = fn
        return _loaded[key]


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
