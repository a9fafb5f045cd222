"""Where recipes are found: the search path, lookup by name or path, shadowing notices.

First match wins along :func:`recipe_search_paths`: the working directory's ``recipes/``, then
``RLZOO_RECIPE_PATH``, then the paths plugins add (``rlzoo_recipe_search_paths``, rlzoo's own
recipes among them).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rlzoo.kernel.errors import RlzooError, closest
from rlzoo.kernel.plugins import PluginManager, get_plugin_manager

__all__ = ["find_recipe", "list_recipes", "notice_shadowing", "recipe_search_paths"]


def recipe_search_paths(pm: PluginManager | None = None) -> list[Path]:
    """Where recipes are looked up, first match wins."""
    pm = pm or get_plugin_manager()
    paths = [Path.cwd() / "recipes"]
    extra = os.environ.get("RLZOO_RECIPE_PATH")
    if extra:
        paths += [Path(p) for p in extra.split(os.pathsep) if p]
    paths += [Path(p) for p in pm.recipe_search_paths()]
    seen: list[Path] = []
    for p in paths:
        if p not in seen:
            seen.append(p)
    return seen


def find_recipe(name: str, pm: PluginManager | None = None) -> Path:
    """A recipe file by name (``quickstart``) or path (``my/recipe.yaml``)."""
    p = Path(name)
    if p.suffix in {".yaml", ".yml"} and p.exists():
        return p.resolve()
    paths = recipe_search_paths(pm)
    for d in paths:
        for cand in (d / f"{name}.yaml", d / f"{name}.yml"):
            if cand.exists():
                return cand.resolve()
    available = sorted(list_recipes(pm))

    near = closest(name, available)
    msg = f"unknown recipe {name!r}. Available recipes: {', '.join(available) or '(none)'}"
    if near:
        msg += f". Did you mean: {', '.join(near)}?"
    msg += f" (searched: {', '.join(str(d) for d in paths)})"
    raise RlzooError(msg)


def notice_shadowing(name: str, path: Path, pm: PluginManager) -> None:
    """Say so when the recipe found first hides another recipe of the same name further down the
    search path (e.g. ``./recipes/quickstart.yaml`` hides rlzoo's own quickstart)."""

    if Path(name).suffix in {".yaml", ".yml"}:
        return
    hidden = [
        cand.resolve()
        for d in recipe_search_paths(pm)
        for cand in (d / f"{name}.yaml", d / f"{name}.yml")
        if cand.exists() and cand.resolve() != path
    ]
    if hidden:
        print(
            f"rlzoo: recipe {name!r} is {path}; it shadows {', '.join(map(str, hidden))} "
            f"(first match on the recipe search path wins; pass a file path to pick another)",
            file=sys.stderr,
            flush=True,
        )


def list_recipes(pm: PluginManager | None = None) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for d in reversed(recipe_search_paths(pm)):
        if d.is_dir():
            for f in d.glob("*.yaml"):
                if not f.name.startswith("_"):
                    out[f.stem] = f
    return out
