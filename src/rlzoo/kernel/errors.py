"""Exceptions with messages that say what was wrong and what would be right."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Sequence
from typing import Any


class RlzooError(Exception):
    """Base class of every error rlzoo raises on purpose."""


class PluginError(RlzooError):
    """A plugin is malformed: a misspelt hook, an argument not in the spec, a clash of names."""


class DuplicateComponentError(PluginError):
    """Two plugins (or one plugin twice) registered the same name for the same kind.

    ``plugins``: the plugin that registered the name first, then the one that registered it again.
    """

    def __init__(self, message: str, plugins: tuple[str, str] = ("?", "?")) -> None:
        super().__init__(message)
        self.plugins = plugins


class UnknownComponentError(RlzooError, KeyError):
    """A recipe or a call asked for a name no plugin registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ConfigError(RlzooError, ValueError):
    """A recipe has one or more problems. ``problems`` lists each with its key path."""

    def __init__(self, problems: Sequence[str] | str, header: str = "invalid recipe") -> None:
        # one problem given as a string is one problem, not one per character
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        lines = [f"{header}: {len(self.problems)} problem(s)"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The registered names most similar to ``name`` (for 'did you mean')."""
    return difflib.get_close_matches(name, list(choices), n=n, cutoff=0.5)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` with the choice closest to ``name``; "" when none is close."""
    near = closest(name, choices)
    return f"; did you mean {near[0]!r}?" if near else ""


def raise_problems(what: str, problems: Sequence[str], error: type[Exception] = ValueError) -> None:
    """Every problem found, reported at once: ``error("<what>: <first>; <second>; ...")``; nothing
    when there are none."""
    if problems:
        raise error(f"{what}: " + "; ".join(problems))


def import_optional(module: str, missing: str, error: type[Exception] = RlzooError) -> Any:
    """``module``, imported; when it (or one of its own imports) is missing, ``error(missing)``: the
    message says which part needs it and the ``pip install`` that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise error(missing) from exc
