"""No import cycles among rlzoo's modules, counting imports inside functions, and no arrow back up.

A function-local import only postpones a cycle to the first call; the cycle graph includes them
(``if TYPE_CHECKING:`` blocks excepted: they never run). Two modules that need each other's names
are one module, or share a third that both import.

The rooms of ``src/rlzoo/`` stand in layers (:data:`LAYERS`, bottom first): a module imports only
from its own layer or the ones below it -- type-only imports (``if TYPE_CHECKING:``) included, since
a type that points up is a dependency that points up. docs/architecture.md draws the same stack.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: package -> folder (import paths are file paths)
TREES = {
    "rlzoo": ROOT / "src" / "rlzoo",
    "rlzoo_from_verl": ROOT / "plugins" / "rlzoo-from-verl" / "src" / "rlzoo_from_verl",
}


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg, folder in TREES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join([pkg, *parts])] = path
    return mods


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skip.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return skip


def _targets(node: ast.AST, here: str, is_pkg: bool, mods: dict[str, Path]) -> list[str]:
    """The rlzoo modules an import statement runs (the deepest existing module of each name)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = here.split(".") if is_pkg else here.split(".")[:-1]
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join([*anchor, *([node.module] if node.module else [])])
        # `from pkg import sub` runs pkg.sub when sub is a module, else only pkg
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    out = []
    for name in names:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name and name != here:
            out.append(name)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                graph[mod].update(_targets(node, mod, path.name == "__init__.py", mods))
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


#: the layers of src/rlzoo/, bottom first: module prefixes (a longer prefix wins). The parts
#: (algorithms, backends, tasks, the batch sources) are plugins: they stand above the core they use,
#: and the core reaches them through the registry only (tests/meta/test_runtime_imports.py).
LAYERS: list[tuple[str, ...]] = [
    (
        "rlzoo.version",
        "rlzoo.kernel",
    ),  # contracts: hooks, kinds, registry, params, Protocols, settings, Batch
    ("rlzoo.system", "rlzoo.data", "rlzoo.rollout_kit"),  # the OS, the data schema, the sample stream
    ("rlzoo.sandbox",),  # untrusted code in a box: scorers, environments and tools run code through it
    (
        "rlzoo.models",
        "rlzoo.agents",
        "rlzoo.gateway",
    ),  # model files and tokenizers; the multi-turn rollout; the gateway
    ("rlzoo.train_kit", "rlzoo.recipe"),  # what train backends share; the recipe language (not compose)
    ("rlzoo.report", "rlzoo.loggers", "rlzoo.distributed", "rlzoo.placement"),  # metrics out; where parts run
    ("rlzoo.train",),  # the run: session, one loop, checkpoints, export
    ("rlzoo.recipe.compose",),  # a recipe into a run
    ("rlzoo", "rlzoo.cli"),  # the public facade and the command line
    ("rlzoo.sources", "rlzoo.algorithms", "rlzoo.backends", "rlzoo.tasks", "rlzoo.recipes", "rlzoo.testing"),
]


def _layer(mod: str) -> int:
    best, found = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (mod == prefix or mod.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), i
    return found


def _typed_graph() -> dict[str, set[str]]:
    """Every import of rlzoo's own modules, type-only imports and function-local ones included."""
    mods = {m: p for m, p in _modules().items() if m.startswith("rlzoo.") or m == "rlzoo"}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[mod].update(t for t in _targets(node, mod, path.name == "__init__.py", mods))
    return graph


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in _typed_graph() if _layer(m) < 0)
    assert not missing, f"modules in no layer of LAYERS: {missing}"


def test_no_arrow_back_up() -> None:
    graph = _typed_graph()
    up = [
        f"{mod} (layer {_layer(mod)}) -> {target} (layer {_layer(target)})"
        for mod, targets in sorted(graph.items())
        for target in sorted(targets)
        if _layer(target) > _layer(mod)
    ]
    assert not up, "imports that point up the layers (type-only imports count):\n" + "\n".join(up)


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles = _cycles(graph)
    detail = []
    for comp in cycles:
        members = set(comp)
        detail.append(" <-> ".join(comp))
        detail += [f"    {m} -> {', '.join(sorted(graph[m] & members))}" for m in comp]
    assert not cycles, "import cycles (function-local imports count):\n" + "\n".join(detail)


def test_the_check_finds_a_cycle_a_deferred_import_hides() -> None:
    graph = {"rlzoo.a": {"rlzoo.b"}, "rlzoo.b": {"rlzoo.c"}, "rlzoo.c": {"rlzoo.a"}, "rlzoo.d": {"rlzoo.a"}}
    assert _cycles(graph) == [["rlzoo.a", "rlzoo.b", "rlzoo.c"]]
    tree = ast.parse("def f():\n    from rlzoo.recipe.config import load_config\n")
    mods = {"rlzoo.recipe.config": Path("x"), "rlzoo.report.metrics": Path("y")}
    found = [t for n in ast.walk(tree) for t in _targets(n, "rlzoo.report.metrics", False, mods)]
    assert found == ["rlzoo.recipe.config"]


def test_no_type_level_cycles() -> None:
    """Two modules whose annotations name each other are one idea split in two: no cycle even
    counting ``if TYPE_CHECKING:`` imports (the layers above forbid those across rooms; this holds
    inside a room too)."""
    graph = _typed_graph()
    cycles = _cycles(graph)
    assert not cycles, "cycles counting type-only imports:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _defined_names(path: Path) -> set[str]:
    """Top-level names a module defines or imports (what ``from module import name`` can take)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def test_every_first_party_import_resolves() -> None:
    """Import paths are file paths: every ``rlzoo`` / ``rlzoo_from_verl`` import in the shipped code
    names a module file under ``src/`` (or the plugin's ``src/``) and a name it defines, so a type
    checker reads it (none falls back to ``Any``); pyproject's mypy ignores missing imports for
    listed third-party packages only."""
    mods = _modules()
    bad = []
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                bad += [
                    f"{mod}: import {a.name}"
                    for a in node.names
                    if a.name.startswith("rlzoo") and a.name not in mods
                ]
            elif (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("rlzoo")
            ):
                target = node.module or ""
                if target not in mods:
                    bad.append(f"{mod}: from {target} import ... (no such module file)")
                    continue
                have = _defined_names(mods[target])
                bad += [
                    f"{mod}: from {target} import {a.name}"
                    for a in node.names
                    if a.name != "*" and a.name not in have and f"{target}.{a.name}" not in mods
                ]
    assert not bad, "first-party imports that resolve to no file or name:\n" + "\n".join(bad)
