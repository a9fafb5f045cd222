"""Python files a user names in a recipe (a scoring function, a dataset class, a sampler): read as text
when the recipe is validated (:func:`parse_user_file`, nothing in them runs), imported once per process at
run time from that path only (:func:`load_from_file`), never through ``sys.path``."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
import threading
from pathlib import Path
from typing import Any

_loaded: dict[tuple[str, str], Any] = {}
_lock = threading.Lock()


def parse_user_file(path: str, key: str, wanted: str) -> ast.Module:
    """The file's syntax tree, or a ValueError naming ``key`` (the recipe key of the path) and what is
    wrong: missing, a directory, not Python that parses. ``wanted``: what the file should define."""
    file = Path(path).expanduser()
    if not file.is_file():
        what = (
            "is a directory" if file.is_dir() else "does not exist" if not file.exists() else "is not a file"
        )
        raise ValueError(f"{key} {path!r} {what}; give the Python file that defines {wanted}")
    try:
        return ast.parse(file.read_bytes(), filename=str(file))
    except SyntaxError as e:
        raise ValueError(f"{key} {path!r} is not Python that parses: {e.msg} (line {e.lineno})") from None
    except ValueError as e:  # NUL bytes
        raise ValueError(f"{key} {path!r} is not a Python source file ({e})") from None


def load_from_file(path: str, name: str, prefix: str) -> Any:
    """``name`` from the file at ``path``, importing it once per process under a private module name
    (``prefix`` + a hash of the path) from that path only."""
    file = str(Path(path).expanduser().resolve())
    key = (file, name)
    with _lock:
        if key not in _loaded:
            module_name = prefix + hashlib.sha1(file.encode()).hexdigest()[:12]
            module = sys.modules.get(module_name)
            if module is None:
                spec = importlib.util.spec_from_file_location(module_name, file)
                if spec is None or spec.loader is None:
                    raise RuntimeError(f"cannot import {file}")
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module  # pickling and dataclasses in the file need it registered
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop(module_name, None)
                    raise
            if not hasattr(module, name):
                raise RuntimeError(f"{file} has no {name!r} after import")
            _loaded[key] = getattr(module, name)
        return _loaded[key]


def keyword_fit(a: ast.arguments, passed: list[str], *, method: bool = False) -> tuple[list[str], list[str]]:
    """How a call with the keywords ``passed`` fits the parameters ``a`` of a function (``method``: the
    first positional one is ``self``): (keywords it does not accept, parameters without a default that
    the call does not pass). Both empty: the call binds."""
    named = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    posonly = {x.arg for x in a.posonlyargs}
    missing = [k for k in passed if (k not in named or k in posonly) and a.kwarg is None]
    positional = [x.arg for x in (*a.posonlyargs, *a.args)][1 if method else 0 :]
    required = positional[: len(positional) - len(a.defaults)]
    required += [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    return missing, [k for k in required if k not in passed]
