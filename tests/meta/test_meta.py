"""Meta-tests (datasette style): every hook is tested and documented; every part is documented."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from rlzoo.kernel.kinds import KINDS
from rlzoo.kernel.plugins import BUILTIN_PLUGINS, PluginManager
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
    assert hook in _test_sources(), f"no test mentions hook {hook}; add one (tests/kernel/test_hooks.py)"


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

    with pytest.raises(ValueError, match="lr must be a finite number, got nan"):
        OptimSettings(lr=float("nan"))
    with pytest.raises(ValueError, match=r"dropout must be < 1, got 1\.0"):
        LoraSettings(dropout=1.0)
    with pytest.raises(ValueError, match="log_prob_chunk must be >= 0, got -1"):
        MicroBatchSettings(log_prob_chunk=-1)


# ---------------------------------------------------------------------------------------------
# one spelling of a registration: a typed hook function that calls registry.register
# ---------------------------------------------------------------------------------------------
EXAMPLE_PACKAGE = ROOT / "plugins" / "rlzoo-example" / "rlzoo_example"


def _shipped_plugin_files() -> dict[str, Path]:
    """Every built-in plugin module and every module of the example plugin (which authors copy)."""
    files = {}
    for modname in BUILTIN_PLUGINS:
        spec = importlib.util.find_spec(modname)
        assert spec is not None and spec.origin is not None, modname
        files[modname] = Path(spec.origin)
    for path in sorted(EXAMPLE_PACKAGE.rglob("*.py")):
        files[f"rlzoo_example.{path.relative_to(EXAMPLE_PACKAGE).with_suffix('').as_posix()}"] = path
    return files


def _called_name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def registration_problems(source: str, where: str) -> tuple[list[str], set[str]]:
    """What in ``source`` registers parts other than the one way, and the registration hooks it
    defines. The one way: a module-level ``@hookimpl def rlzoo_register_<kind>s(registry:
    Registrar[...]) -> None`` whose body calls ``registry.register``, no ``# type: ignore`` on it."""
    tree = ast.parse(source)
    lines = source.splitlines()
    problems: list[str] = []
    hooks: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) in ("registers", "Registration"):
            problems.append(f"{where}:{node.lineno}: {_called_name(node)}(...) declares parts as data")
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AnnAssign, ast.AugAssign))
            else []
        )
        for t in targets:
            if isinstance(t, ast.Name) and t.id.startswith("rlzoo_register_"):
                problems.append(f"{where}:{node.lineno}: {t.id} is assigned, not defined with def")
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("rlzoo_register_")):
            continue
        hooks.add(node.name)
        at = f"{where}:{node.lineno}: {node.name}"
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        if any("type: ignore" in line for line in lines[first - 1 : node.end_lineno]):
            problems.append(f"{at} carries a '# type: ignore'")
        if not any("hookimpl" in ast.unparse(d) for d in node.decorator_list):
            problems.append(f"{at} is not decorated with @hookimpl")
        args = node.args.args
        if [a.arg for a in args] != ["registry"] or args[0].annotation is None:
            problems.append(f"{at} must take one argument, registry: Registrar[...]")
        elif "Registrar" not in ast.unparse(args[0].annotation):
            problems.append(
                f"{at}: registry is annotated {ast.unparse(args[0].annotation)}, not Registrar[...]"
            )
        if node.returns is None or ast.unparse(node.returns) != "None":
            problems.append(f"{at} must be annotated '-> None'")
    return problems, hooks


def test_every_shipped_plugin_registers_parts_one_way(pm: PluginManager) -> None:
    """Built-ins and the example plugin register the way a third party does: no parts declared as
    data, no untyped hook silenced with ``# type: ignore``. The walk reads the files Python loads
    and finds every registration hook that pluggy found in each built-in."""
    problems: list[str] = []
    found: dict[str, set[str]] = {}
    for modname, path in _shipped_plugin_files().items():
        where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        more, found[modname] = registration_problems(path.read_text(), where)
        problems += more
    assert not problems, "\n".join(problems)
    loaded = {i.name: i for i in pm.plugins(include_all=True)}
    for modname in BUILTIN_PLUGINS:
        hooked = {h for h in loaded[modname].hooks if h.startswith("rlzoo_register_")}
        assert found[modname] == hooked, (modname, found[modname], hooked)
    assert found["rlzoo_example.plugin"] == {"rlzoo_register_advantages", "rlzoo_register_scorers"}


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("rlzoo_register_kls = registers(Registration('k', 'm:f'))\n", "declares parts as data"),
        ("from x import hook\nrlzoo_register_kls = hook\n", "is assigned, not defined"),
        (
            "@hookimpl\ndef rlzoo_register_kls(registry):  # type: ignore[no-untyped-def]\n    pass\n",
            "carries a '# type: ignore'",
        ),
        ("@hookimpl\ndef rlzoo_register_kls(registry):\n    pass\n", "registry: Registrar[...]"),
        ("@hookimpl\ndef rlzoo_register_kls(registry: Registrar[KLFn]):\n    pass\n", "'-> None'"),
        ("def rlzoo_register_kls(registry: Registrar[KLFn]) -> None:\n    pass\n", "not decorated"),
        (
            "@hookimpl\ndef rlzoo_register_kls(registry: Registrar[KLFn]) -> None:\n"
            "    registry.register(*Registration('k', 'm:f'))\n",
            "declares parts as data",
        ),
    ],
)
def test_the_registration_walk_refuses_the_other_spellings(source: str, says: str) -> None:
    problems, _ = registration_problems(source, "plugin.py")
    assert any(says in p for p in problems), problems


def test_the_registration_walk_accepts_the_one_way() -> None:
    source = (
        "@hookimpl\ndef rlzoo_register_kls(registry: Registrar[KLFn]) -> None:\n"
        "    registry.register('k', 'm:f', params=P)\n"
    )
    assert registration_problems(source, "plugin.py") == ([], {"rlzoo_register_kls"})
