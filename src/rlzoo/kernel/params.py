"""``param``: a documented field of a part's params dataclass (help text, declared range).

Its own module so that every params class (core settings, capability records, plugins' params) can
declare fields without importing the registry.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any

#: the largest magnitude of an integer setting: a signed 64-bit integer, what torch and numpy take
INT_LIMIT = 2**63 - 1
#: the largest seed: what every random generator rlzoo seeds accepts (numpy's legacy seeds, 32 bits)
MAX_SEED = 2**32 - 1


def param(
    default: Any = dataclasses.MISSING,
    *,
    help: str,  # noqa: A002
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    **kw: Any,
) -> Any:
    """Declare a documented field of a part's params dataclass.

    ``help`` is shown by ``rlzoo components`` and in the generated reference docs; the
    conformance suite fails a part whose params have an undocumented field. ``ge`` / ``gt`` /
    ``le`` / ``lt`` declare the field's range (a number; ``None`` values are not checked), once:
    ``rlzoo validate`` reports every value out of range at once (:func:`range_problems`), and a
    class built directly in Python checks them in its ``__post_init__`` with :func:`check_ranges`.
    Every number field has a range even without one declared: a float must be finite (NaN and
    infinity are refused), an integer must fit a signed 64-bit integer (:data:`INT_LIMIT`); numbers
    inside a list or tuple field are held to the same.
    """
    metadata = dict(kw.pop("metadata", {}) or {})
    metadata["help"] = help
    for key, bound in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)):
        if bound is not None:
            metadata[key] = bound
    if isinstance(default, (list, dict, set)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata=metadata, **kw)
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        instance = default
        return field(default_factory=lambda: dataclasses.replace(instance), metadata=metadata, **kw)
    if default is dataclasses.MISSING:
        return field(metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


def _unrepresentable(value: Any) -> str | None:
    """What every number setting must be, whatever range it declares: finite, and an integer that
    fits 64 bits (None: ``value`` is fine, or no number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if isinstance(value, int) and abs(value) > INT_LIMIT:
        return f"must fit a 64-bit integer (at most {INT_LIMIT:.3g} in magnitude), got {value:.3g}"
    return None


def _bound(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _out_of_range(f: dataclasses.Field[Any], value: Any) -> str | None:
    """What is wrong with ``value`` against the range ``f`` declares (None: in range or no number)."""
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = _unrepresentable(item)
            if problem is not None:
                return f"[{i}] {problem}"
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # None, or a value of the wrong type (binding reports those)
    problem = _unrepresentable(value)
    if problem is not None:
        return problem
    ge, gt, le, lt = (f.metadata.get(k) for k in ("ge", "gt", "le", "lt"))
    if ge is not None and not value >= ge:
        return f"must be >= {_bound(ge)}, got {value!r}"
    if gt is not None and not value > gt:
        return f"must be > {_bound(gt)}, got {value!r}"
    if le is not None and not value <= le:
        return f"must be <= {_bound(le)}, got {value!r}"
    if lt is not None and not value < lt:
        return f"must be < {_bound(lt)}, got {value!r}"
    return None


def _faults(obj: Any) -> list[tuple[str, str]]:
    """``(field, "must be ...")`` for every field of dataclass ``obj`` outside its declared range."""
    if not (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        return []
    faults = ((f.name, _out_of_range(f, getattr(obj, f.name, None))) for f in dataclasses.fields(obj))
    return [(name, problem) for name, problem in faults if problem is not None]


def range_problems(obj: Any, path: str) -> list[str]:
    """Every number field of dataclass ``obj`` outside the range its field declares
    (``param(..., ge=, gt=, le=, lt=)``), one ``"path.field: must be ..."`` message each; nested
    dataclasses are the caller's to walk."""
    return [f"{path}.{name}: {problem}" if path else f"{name}: {problem}" for name, problem in _faults(obj)]


def check_ranges(obj: Any) -> list[str]:
    """``"field must be ..."`` for every field of ``obj`` outside its declared range: what a
    ``__post_init__`` raises (with its own cross-field rules), so a range is declared once."""
    return [f"{name} {problem}" for name, problem in _faults(obj)]
