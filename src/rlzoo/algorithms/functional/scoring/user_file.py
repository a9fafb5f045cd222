"""The ``python_file`` scorer: a scoring function from a file the user names (verl's
``custom_reward_function.path`` / ``.name`` / ``.reward_kwargs``).

:func:`check_function` reads the file as text (``ast``), so validating a recipe runs none of it.
:func:`compute_score` imports the file once per process, under a private module name, from that path
only, and calls the function with verl's keywords.
"""

from __future__ import annotations

import ast
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

#: the keywords verl passes a custom reward function (verl/trainer/ppo/reward.py), in order
VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")

_loaded: dict[tuple[str, str], Callable[..., Any]] = {}
_lock = threading.Lock()


def check_function(path: str, name: str, kwargs: Mapping[str, object]) -> None:
    """Refuse, with what is wrong and what would be right, a file or function verl's call cannot use.
    Reads the file as text only."""
    if not path:
        raise ValueError(
            "path is required: the Python file that defines your scoring function, e.g. "
            "{name: python_file, path: my_reward.py, function: compute_score}"
        )
    file = Path(path).expanduser()
    if not file.is_file():
        what = (
            "is a directory" if file.is_dir() else "does not exist" if not file.exists() else "is not a file"
        )
        raise ValueError(f"path {path!r} {what}; give the Python file that defines {name!r}")
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except SyntaxError as e:
        raise ValueError(f"path {path!r} is not Python that parses: {e.msg} (line {e.lineno})") from None
    except ValueError as e:  # NUL bytes
        raise ValueError(f"path {path!r} is not a Python source file ({e})") from None
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if not defs:
        found = sorted(n.name for n in tree.body if isinstance(n, ast.FunctionDef))
        raise ValueError(
            f"{path!r} defines no top-level function {name!r} (its functions: {found or 'none'}); set "
            "function to the one that scores"
        )
    fn = defs[-1]  # the last definition wins, as when the module runs
    if isinstance(fn, ast.AsyncFunctionDef):
        raise ValueError(f"{name!r} in {path!r} is async; a scoring function is called synchronously")
    a = fn.args
    named = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    posonly = {x.arg for x in a.posonlyargs}
    wanted = [*VERL_ARGS, *kwargs]
    missing = [k for k in wanted if (k not in named or k in posonly) and a.kwarg is None]
    if missing:
        raise ValueError(
            f"{name}() in {path!r} does not accept the keyword(s) {missing}; verl's call passes "
            f"{', '.join(VERL_ARGS)} (and the kwargs setting): add them to its parameters, or **kwargs"
        )
    required = [x.arg for x in (*a.posonlyargs, *a.args)][
        : len(a.posonlyargs) + len(a.args) - len(a.defaults)
    ]
    required += [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    unmet = [k for k in required if k not in wanted]
    if unmet:
        raise ValueError(
            f"{name}() in {path!r} requires {unmet}, which verl's call does not pass; give them defaults or "
            "set them in kwargs"
        )


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
