"""Binding plain mappings (from YAML) onto typed dataclasses, collecting every problem.

One mechanism binds both the recipe sections (:mod:`rlzoo.recipe.config`) and each part's params
dataclass. Every problem is reported with its key path, e.g.
``algorithm.policy_loss.clip_ratio_hgh: unknown param of policy_loss 'ppo_clip'``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Union, get_args, get_origin

from rlzoo.kernel.errors import did_you_mean

_NONE = type(None)


def _type_name(tp: Any) -> str:
    if tp is Any:
        return "any"
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (list, tuple):
        args = get_args(tp)
        return f"list[{_type_name(args[0]) if args else 'any'}]"
    if origin is dict:
        args = get_args(tp)
        return f"dict[str, {_type_name(args[1]) if len(args) > 1 else 'any'}]"
    if tp is _NONE:
        return "null"
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, path: str, problems: list[str]) -> Any:
    """Check ``value`` against type ``tp``; return the (lightly converted) value."""
    if tp is Any or tp is object:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if _NONE in args:
                return None
            problems.append(f"{path}: must not be null (expected {_type_name(tp)})")
            return None
        options = [a for a in args if a is not _NONE]
        if len(options) == 1:  # X | None: X's own problems say more than "expected X | null"
            return coerce(value, options[0], path, problems)
        for arg in args:
            if arg is _NONE:
                continue
            trial: list[str] = []
            out = coerce(value, arg, path, trial)
            if not trial:
                return out
        problems.append(f"{path}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
        return value
    if origin is Literal:
        if value not in get_args(tp):
            choices = ", ".join(repr(a) for a in get_args(tp))
            problems.append(f"{path}: {value!r} is not one of {choices}")
        return value
    if origin in (list, tuple) or tp in (list, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            problems.append(f"{path}: expected a list, got {type(value).__name__} {value!r}")
            return value
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [coerce(v, item_tp, f"{path}[{i}]", problems) for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            problems.append(f"{path}: expected a mapping, got {type(value).__name__} {value!r}")
            return value
        args = get_args(tp)
        val_tp = args[1] if len(args) > 1 else Any
        return {k: coerce(v, val_tp, f"{path}.{k}", problems) for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            problems.append(f"{path}: expected a mapping, got {type(value).__name__} {value!r}")
            return value
        return bind_dataclass(tp, value, path, problems)
    if tp is bool:
        if isinstance(value, bool):
            return value
        problems.append(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        problems.append(f"{path}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # "1e-6" from YAML 1.1 scalars
            except ValueError:
                pass
        problems.append(f"{path}: expected a number, got {type(value).__name__} {value!r}")
        return value
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        problems.append(f"{path}: expected a string, got {type(value).__name__} {value!r}")
        return value
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        problems.append(f"{path}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return value


def field_types(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # unresolved forward refs: fall back to Any
        return {f.name: Any for f in dataclasses.fields(cls)}


def bind_dataclass(
    cls: type,
    values: Mapping[str, Any],
    path: str,
    problems: list[str],
    *,
    what: str | None = None,
    custom: typing.Callable[[dataclasses.Field[Any], Any, str, list[str]], Any] | None = None,
) -> Any:
    """Instantiate dataclass ``cls`` from ``values``; append one message per problem.

    ``custom(field, value, path, problems)`` may handle a field itself (returning the bound value)
    or return :data:`NotImplemented` to use the default coercion.
    """
    hints = field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    what = what or cls.__name__
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in fields:
            known = ", ".join(sorted(fields)) or "(none)"
            hint = did_you_mean(str(key), fields)
            problems.append(f"{sub}: unknown key for {what}{hint} Known keys: {known}")
            continue
        f = fields[key]
        if custom is not None:
            out = custom(f, value, sub, problems)
            if out is not NotImplemented:
                kwargs[key] = out
                continue
        kwargs[key] = coerce(value, hints.get(key, Any), sub, problems)
    missing = [
        name
        for name, f in fields.items()
        if name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    for name in missing:  # every one of them, not only the first
        sub = f"{path}.{name}" if path else name
        problems.append(f"{sub}: required by {what} but missing")
    if missing:
        return None
    try:
        return cls(**kwargs)
    except Exception as exc:  # __post_init__ validation of the dataclass itself
        problems.append(f"{path or what}: {exc}")
        return None


def to_plain(obj: Any) -> Any:
    """Dataclasses / tuples -> plain dicts / lists (for run records and JSON)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def tree_nodes(obj: Any, path: str = "", *, leaves: tuple[type, ...] = ()) -> Iterator[tuple[str, Any]]:
    """``(path, node)`` for ``obj`` and every node under it, depth first, parents first: a dataclass
    instance's fields (path ``a.b``), a mapping's values and a list's or tuple's items (their
    parent's path). An instance of one of ``leaves`` is yielded but not entered."""
    yield path, obj
    if isinstance(obj, leaves):
        return
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from tree_nodes(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name, leaves=leaves)
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from tree_nodes(v, path, leaves=leaves)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tree_nodes(v, path, leaves=leaves)
