"""Meta-tests (datasette style): every hook is tested and documented; every part is documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlzoo.kernel.kinds import KINDS
from rlzoo.kernel.plugins import PluginManager
from rlzoo.report.docgen import hook_functions
from rlzoo.testing import component_problems

ROOT = Path(__file__).resolve().parents[2]
HOOKS = [f.__name__ for f in hook_functions()]


def _test_sources() -> str:
    files = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("plugins/*/tests/**/*.py")]
    return "\n".join(p.read_text() for p in files if p.resolve() != Path(__file__).resolve())


def test_hookspecs_found() -> None:
    assert len(HOOKS) >= len(KINDS) + 1
    assert {k.hook for k in KINDS} <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_test(hook: str) -> None:
    assert hook in _test_sources(), f"no test mentions hook {hook}; add one (tests/core/test_hooks.py)"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented(hook: str) -> None:
    text = (ROOT / "docs" / "plugins.md").read_text()
    assert f"`{hook}" in text, f"docs/plugins.md has no entry for hook {hook}"


def test_every_part_is_documented(pm: PluginManager) -> None:
    """Each registered part has a doc line, and every params field has help text."""
    problems = [
        p
        for kind in KINDS
        for comp in pm.registry(kind.name)
        for p in component_problems(comp, load=False)
        if "doc line" in p or "help text" in p
    ]
    assert not problems, "\n".join(problems)


def test_every_part_conforms_to_the_generic_checks(pm: PluginManager) -> None:
    """Frozen params whose defaults bind back from a recipe (targets are not imported here)."""
    problems = [
        p for kind in KINDS for comp in pm.registry(kind.name) for p in component_problems(comp, load=False)
    ]
    assert not problems, "\n".join(problems)
