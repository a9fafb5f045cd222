"""``param``: a documented field of a part's params dataclass (help text, declared range).

Its own module so that every params class (core settings, capability records, plugins' params) can
declare fields without importing the registry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


def param(
    default: Any = dataclasses.MISSING,
    *,
    help: str,  # noqa: A002
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    **kw: Any,
) -> Any:
    """Declare a documented field of a part's params dataclass.

    ``help`` is shown by ``rlzoo components`` and in the generated reference docs; the
    conformance suite fails a part whose params have an undocumented field. ``ge`` / ``gt`` /
    ``le`` declare the field's range (a number; ``None`` values are not checked): ``rlzoo
    validate`` reports every value out of range at once (:func:`rlzoo.kernel.binding.range_problems`).
    """
    metadata = dict(kw.pop("metadata", {}) or {})
    metadata["help"] = help
    for key, bound in (("ge", ge), ("gt", gt), ("le", le)):
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
