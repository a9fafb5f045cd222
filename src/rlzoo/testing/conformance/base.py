"""What every conformance suite shares: the registration checks (:func:`component_problems`,
:func:`check_component`), small tensor helpers, and :class:`ComponentConformance`, the base suite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

from rlzoo.kernel.binding import bind_dataclass, to_plain
from rlzoo.kernel.kinds import KIND_BY_NAME
from rlzoo.kernel.registry import Component

if TYPE_CHECKING:
    from rlzoo.kernel.plugins import PluginManager


# ---------------------------------------------------------------------------------------------
# generic checks
# ---------------------------------------------------------------------------------------------
def component_problems(component: Component[Any], *, load: bool = True) -> list[str]:
    """Everything wrong with a part's registration, one message per problem (empty: conforms).

    Checks: a known kind; a non-empty one-line summary; params (if any) a frozen dataclass whose
    fields all carry ``help`` (declare them with :func:`rlzoo.param`), whose defaults instantiate
    and survive a round trip through the recipe binder; string capability keys; and, with
    ``load``, a target that imports and is callable.
    """
    where = f"{component.kind} {component.name!r} (plugin {component.plugin!r})"
    problems: list[str] = []
    if component.kind not in KIND_BY_NAME:
        problems.append(f"{where}: unknown kind {component.kind!r}")
    if not component.summary:
        problems.append(
            f"{where}: no doc line; give the params dataclass a docstring or pass doc= at registration"
        )
    for key in component.capabilities:
        if not isinstance(key, str) or not key:
            problems.append(f"{where}: capability keys must be non-empty strings, got {key!r}")
    params = component.params
    if params is not None:
        if not (isinstance(params, type) and dataclasses.is_dataclass(params)):
            problems.append(f"{where}: params must be a dataclass type, got {params!r}")
        else:
            if not params.__dataclass_params__.frozen:  # type: ignore[attr-defined]
                problems.append(f"{where}: params dataclass {params.__name__} must be frozen")
            required = []
            for f in dataclasses.fields(params):
                if not str(f.metadata.get("help", "")).strip():
                    problems.append(
                        f"{where}: param {f.name!r} has no help text; declare it with "
                        f"rlzoo.param(default, help=...)"
                    )
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    required.append(f.name)
            if not required:
                problems += _default_problems(params, where)
    if load:
        try:
            target = component.load()
        except Exception as exc:
            problems.append(
                f"{where}: target {component.target!r} does not import: {type(exc).__name__}: {exc}"
            )
        else:
            if not callable(target):
                problems.append(f"{where}: target {target!r} is not callable")
    return problems


def _default_problems(params: type, where: str) -> list[str]:
    try:
        defaults = params()
    except Exception as exc:
        return [f"{where}: params defaults do not instantiate: {type(exc).__name__}: {exc}"]
    bind: list[str] = []
    again = bind_dataclass(params, to_plain(defaults), "params", bind, what=where)
    if bind:
        return [f"{where}: defaults do not bind back from a recipe: {'; '.join(bind)}"]
    if again != defaults:
        return [f"{where}: defaults change in a round trip through the recipe binder: {defaults} != {again}"]
    return []


def check_component(component: Component[Any], *, load: bool = True) -> None:
    """Raise ``AssertionError`` listing every problem :func:`component_problems` finds."""
    problems = component_problems(component, load=load)
    if problems:
        raise AssertionError("\n".join(["part does not conform:", *(f"  - {p}" for p in problems)]))


# ---------------------------------------------------------------------------------------------
# the base suite
# ---------------------------------------------------------------------------------------------
class ComponentConformance:
    """Checks every part shares. Subclass a kind's suite and set :attr:`name`.

    Override :meth:`plugin_manager` to test a part that is not installed (e.g. a plugin object
    registered with :meth:`rlzoo.kernel.plugins.PluginManager.register`).
    """

    kind: ClassVar[str] = ""
    #: the registered name of the part under test
    name: ClassVar[str] = ""
    #: params (as in a recipe) bound on top of the defaults for the contract tests
    params_overrides: ClassVar[Mapping[str, Any]] = {}
    #: tolerances of the numeric comparisons
    atol: ClassVar[float] = 1e-5
    rtol: ClassVar[float] = 1e-5

    # -- how the suite reaches the part -------------------------------------------------------
    def plugin_manager(self) -> PluginManager:
        from rlzoo.kernel.plugins import get_plugin_manager

        return get_plugin_manager()

    @cached_property
    def component(self) -> Component[Any]:
        assert self.kind, f"{type(self).__name__}: set the class attribute 'kind'"
        assert self.name, (
            f"{type(self).__name__}: set the class attribute 'name' to the part's registered name"
        )
        return self.plugin_manager().get(self.kind, self.name, key=f"{type(self).__name__}.name")

    @cached_property
    def params(self) -> Any:
        """The part's params: defaults plus :attr:`params_overrides`, bound as a recipe would."""
        from rlzoo.recipe.config import bind_part

        problems: list[str] = []
        sel = bind_part(
            self.kind,
            {"name": self.name, **self.params_overrides},
            f"{type(self).__name__}",
            problems,
            self.plugin_manager(),
        )
        if problems or sel is None:
            pytest.fail("params do not bind:\n" + "\n".join(problems))
        return sel.params

    @cached_property
    def fn(self) -> Callable[..., Any]:
        return self.component.load()  # type: ignore[no-any-return]

    def make_part(self) -> Any:
        """The callable under test (a factory kind builds its object here)."""
        return self.fn

    # -- checks shared by every kind ------------------------------------------------------------
    def test_registered_under_kind(self) -> None:
        comp = self.component
        assert comp.kind == self.kind
        assert self.name == comp.name or self.name in comp.aliases

    def test_has_doc_line(self) -> None:
        assert self.component.summary, (
            f"{self.kind} {self.name!r}: no doc line (give the params dataclass a docstring or pass doc=)"
        )

    def test_params_documented(self) -> None:
        params = self.component.params
        if params is None:
            return
        undocumented = [
            f.name for f in dataclasses.fields(params) if not str(f.metadata.get("help", "")).strip()
        ]
        assert not undocumented, f"params without help text (use rlzoo.param(..., help=...)): {undocumented}"

    def test_params_defaults_bind(self) -> None:
        problems = [p for p in component_problems(self.component, load=False) if "param" in p]
        assert not problems, "\n".join(problems)
        self.params  # noqa: B018  (binds defaults + overrides, fails the test on a problem)

    def test_target_loads(self) -> None:
        assert callable(self.fn), f"{self.component.target!r} is not callable"

    def test_conforms(self) -> None:
        check_component(self.component)
