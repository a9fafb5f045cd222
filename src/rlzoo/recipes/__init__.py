"""rlzoo's own recipes (Hydra YAML files in this folder) and the plugin that puts them on the search path."""

from __future__ import annotations

from pathlib import Path

from rlzoo.kernel.hookspecs import hookimpl

RECIPES_DIR = Path(__file__).resolve().parent


@hookimpl
def rlzoo_recipe_search_paths() -> list[str]:
    return [str(RECIPES_DIR)]
