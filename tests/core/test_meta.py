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


def _ranged_fields_rechecked(source: str) -> list[str]:
    """Classes whose ``__post_init__`` compares a field that ``param(ge=/gt=/le=/lt=)`` already
    bounds: the range said twice (``check_ranges`` is the one way to enforce it)."""
    import ast

    found = []
    for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
        ranged, post = set(), None
        for st in cls.body:
            call = st.value if isinstance(st, ast.AnnAssign) else None
            bounds = isinstance(call, ast.Call) and any(
                k.arg in ("ge", "gt", "le", "lt") for k in call.keywords
            )
            if bounds and getattr(call.func, "id", "") == "param":  # type: ignore[union-attr]
                ranged.add(st.target.id)  # type: ignore[union-attr]
            if isinstance(st, ast.FunctionDef) and st.name == "__post_init__":
                post = st
        if post is None:
            continue
        for node in ast.walk(post):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            fields = [o.attr for o in operands if isinstance(o, ast.Attribute) and o.attr in ranged]
            numbers = [
                o for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, (int, float))
            ]
            if len(fields) == 1 and len(fields) + len(numbers) == len(operands):  # a field against bounds
                found.append(f"{cls.name}.{fields[0]}")
    return found


def test_a_range_is_declared_once() -> None:
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]
    twice = [
        f"{p.relative_to(ROOT)}: {hit}" for p in files for hit in _ranged_fields_rechecked(p.read_text())
    ]
    assert not twice, "ranges declared in param() and checked again in __post_init__:\n" + "\n".join(twice)


def test_the_range_check_sees_a_second_declaration() -> None:
    source = (
        "class P:\n    lr: float = param(1.0, gt=0, help='x')\n"
        "    def __post_init__(self):\n        if not self.lr > 0: raise ValueError\n"
    )
    assert _ranged_fields_rechecked(source) == ["P.lr"]


def test_check_ranges_refuses_nan_and_out_of_range() -> None:
    from rlzoo.kernel.settings import LoraSettings, MicroBatchSettings, OptimSettings

    with pytest.raises(ValueError, match="lr must be > 0, got nan"):
        OptimSettings(lr=float("nan"))
    with pytest.raises(ValueError, match=r"dropout must be < 1, got 1\.0"):
        LoraSettings(dropout=1.0)
    with pytest.raises(ValueError, match="log_prob_chunk must be >= 0, got -1"):
        MicroBatchSettings(log_prob_chunk=-1)
