"""The import contract: what runs at run time never imports test-only code, and the core stays a core.

A fresh interpreter blocks every dev-only package (and ``rlzoo.testing``) with a meta-path finder
that raises on import, then drives the real code a user drives: the CLI's listing and validation
commands over every recipe, every built-in plugin module, every registered part's ``load()``, and a
2-step quickstart run (which prepares its data and model from scratch). Function-local imports are
therefore covered too: they run. A second check reads the core's source: ``rlzoo/`` imports no
implementation module (algorithms, backends, tasks, the from-verl tool), at module level or inside a
function (the from-verl tool is a plugin package: the CLI finds it through a hook); tasks/, like algorithms/, imports no
runtime.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "rlzoo"
#: installed by the ``dev`` extra only (a newcomer's ``pip install -e .`` does not bring them)
DEV_ONLY = ("pytest", "_pytest", "pytest_timeout", "hypothesis", "ruff", "mypy", "rlzoo.testing")

PROBE = r"""
import contextlib, importlib, io, json, os, sys

BLOCKED = tuple(json.loads(sys.argv[1]))
attempts = []

class Block:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
                frame = frame.f_back
            attempts.append([name, frame.f_code.co_filename if frame else "?"])
            raise ImportError(f"dev-only module {name!r} imported at run time")
        return None

# torch's compiler probes for hypothesis with importlib.util.find_spec when it is first imported
# (saving a model imports it: transformers' generation utilities); the probe is third-party and
# tolerant of a missing package, so it runs before the blocker
import torch._dynamo  # noqa: F401

sys.meta_path.insert(0, Block())
for name in list(sys.modules):  # nothing dev-only may be pre-loaded either
    if any(name == b or name.startswith(b + ".") for b in BLOCKED):
        del sys.modules[name]

report = {"steps": [], "errors": []}
QUICK = sys.argv[4] == "quick"

def step(label, fn):
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            fn()
        report["steps"].append(label)
    except BaseException as exc:  # noqa: BLE001 - report everything
        report["errors"].append(f"{label}: {type(exc).__name__}: {exc}")

step("extra: " + sys.argv[3], lambda: exec(sys.argv[3], {}))
from rlzoo.cli import main
from rlzoo.recipe.files import list_recipes
from rlzoo.kernel.kinds import KIND_NAMES
from rlzoo.kernel.plugins import BUILTIN_PLUGINS, get_plugin_manager

def cli(*args):
    code = main(list(args))
    assert code == 0, f"rlzoo {' '.join(args)} exited {code}"

for args in (["components", "--json"], ["plugins", "--all", "--json"], ["recipes"]):
    step("rlzoo " + " ".join(args), lambda a=args: cli(*a))
for recipe in [] if QUICK else sorted(list_recipes()):
    step(f"rlzoo validate {recipe}", lambda r=recipe: cli("validate", r))
for mod in BUILTIN_PLUGINS:
    step(f"import {mod}", lambda m=mod: importlib.import_module(m))
pm = get_plugin_manager()
for kind in KIND_NAMES:
    for comp in pm.registry(kind):
        step(f"{kind} {comp.name}: load()", comp.load)
out = sys.argv[2]
QUICK or step("rlzoo train quickstart (2 steps)", lambda: cli(
    "train", "quickstart", "trainer.total_steps=2", f"run.output_dir={out}"))
report["attempts"] = attempts
print(json.dumps(report))
"""


def _is_ours(filename: str) -> bool:
    path = Path(filename).resolve()
    return "site-packages" not in path.parts and ROOT in path.parents


def _probe(tmp_path: Path, extra: str = "pass", *, quick: bool = False) -> dict:
    env = {
        **os.environ,
        "RLZOO_CACHE": str(tmp_path / "cache"),
        "RLZOO_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    args = [json.dumps(DEV_ONLY), str(tmp_path / "run"), extra, "quick" if quick else "full"]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_runtime_never_imports_dev_only_packages(tmp_path: Path) -> None:
    report = _probe(tmp_path)
    # a third-party library may probe for an optional package (torch's internals look for
    # hypothesis) and carry on without it; rlzoo's own code may not import one at all
    ours = [(name, where) for name, where in report["attempts"] if _is_ours(where)]
    assert not ours, f"run-time code imported dev-only modules: {ours}"
    assert not report["errors"], "\n".join(report["errors"])
    # the probe really drove the code: the CLI, every recipe, the plugins, the parts and a run
    assert any(s.startswith("rlzoo validate quickstart") for s in report["steps"])
    assert any(s.endswith("load()") for s in report["steps"])
    assert "rlzoo train quickstart (2 steps)" in report["steps"]
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


def test_the_probe_catches_a_dev_only_import(tmp_path: Path) -> None:
    """The blocker is not a no-op: the chain that broke the README's first command is caught.

    (Before the fix, the quickstart preparer imported ``rlzoo.testing.tiny``; importing anything
    under ``rlzoo.testing`` runs its ``__init__``, which imports the pytest-based suites.)
    """
    report = _probe(tmp_path, "import rlzoo.testing.conformance", quick=True)
    names = {name for name, _ in report["attempts"]}
    assert {"rlzoo.testing", "rlzoo.testing.conformance"} & names
    assert any("dev-only module" in e for e in report["errors"])


# ---------------------------------------------------------------------------------------------
# layering: the core knows kinds, not implementations
# ---------------------------------------------------------------------------------------------
#: the implementation trees inside src/rlzoo/, and the converter tool (its own plugin package)
IMPLEMENTATION_PACKAGES = ("rlzoo.algorithms", "rlzoo.backends", "rlzoo.tasks", "rlzoo_from_verl")
#: folders of src/rlzoo/ that are not the core: the built-in parts, the recipes, and rlzoo.testing
#: (test code for plugin authors, which may name built-in parts)
NOT_CORE = {"algorithms", "backends", "tasks", "recipes", "testing"}


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def _core_files() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if p.relative_to(SRC).parts[0] not in NOT_CORE]


@pytest.mark.parametrize("where", ["module level", "anywhere"])
def test_core_imports_no_implementation(where: str) -> None:
    bad: list[str] = []
    for path in _core_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        # module level: what runs on import (a function's body runs only when it is called)
        top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        nodes = top if where == "module level" else [tree]
        for node in nodes:
            for lineno, name in _imports(node):
                pkg = next(
                    (p for p in IMPLEMENTATION_PACKAGES if name == p or name.startswith(p + ".")), None
                )
                if pkg is None:
                    continue
                where_ = str(path.relative_to(ROOT))
                bad.append(f"{where_}:{lineno}: imports {name}")
    assert not bad, "the core must reach built-in parts through the registry:\n" + "\n".join(sorted(set(bad)))


# ---------------------------------------------------------------------------------------------
# layering, the other way: algorithms (formulas over tensors) and tasks never import the runtime
# ---------------------------------------------------------------------------------------------
#: the loop, the session and the batch sources; algorithms share math through rlzoo.train_kit.formulas
RUNTIME_PACKAGES = ("rlzoo.train", "rlzoo.sources")


def _runtime_imports(root: Path) -> list[str]:
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        for lineno, name in _imports(ast.parse(path.read_text(), filename=str(path))):
            if any(name == p or name.startswith(p + ".") for p in RUNTIME_PACKAGES):
                bad.append(f"{path.relative_to(root.parent)}:{lineno}: imports {name}")
    return bad


@pytest.mark.parametrize("tree", ["algorithms", "tasks"])
def test_parts_import_no_runtime(tree: str) -> None:
    """Algorithms are formulas; tasks are data, scorers and environments: neither drives a run."""
    bad = _runtime_imports(SRC / tree)
    assert not bad, f"{tree}/ may import the core's kinds and helpers, never the runtime:\n" + "\n".join(bad)


def test_the_reverse_rule_sees_a_function_local_import(tmp_path: Path) -> None:
    pkg = tmp_path / "algorithms"
    pkg.mkdir()
    (pkg / "bad.py").write_text("def f():\n    from rlzoo.train.loop import train\n    return train\n")
    assert "algorithms/bad.py:2: imports rlzoo.train.loop" in _runtime_imports(pkg)


# ---------------------------------------------------------------------------------------------
# backends are peers: what they share lives in the core (rlzoo.train_kit), never in one of them
# ---------------------------------------------------------------------------------------------
def _backend_of(name: str) -> str | None:
    """``rlzoo.backends.X...`` -> ``X`` (None for anything else)."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["rlzoo", "backends"] else None


def _backend_files() -> list[tuple[str, Path]]:
    return [(p.relative_to(SRC / "backends").parts[0], p) for p in sorted((SRC / "backends").rglob("*.py"))]


def test_no_backend_imports_another_backend() -> None:
    """Counting imports inside functions; relative imports that climb out of a backend too."""
    bad: list[str] = []
    files = _backend_files()
    assert {"native", "fsdp2", "megatron", "vllm", "simulated"} <= {b for b, _ in files}
    for backend, path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level > len(path.relative_to(SRC / "backends").parts) - 1
            ):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: relative import above its backend")
        for lineno, name in _imports(tree):
            other = _backend_of(name)
            if other is not None and other != backend:
                bad.append(f"{path.relative_to(ROOT)}:{lineno}: imports {name}")
    assert not bad, (
        "a backend imports another backend; move what they share into the core train kit "
        "(src/rlzoo/train_kit/):\n" + "\n".join(sorted(set(bad)))
    )
