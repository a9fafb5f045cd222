"""Staged recipes: ``stages: [{name, overrides}, ...]`` -> one recipe per stage.

Stage ``k`` is the recipe without its ``stages``, changed by the stage's ``overrides``, run in
``RUN_DIR/stages/<k>-<name>/``; a stage after the first starts from the weights the stage before
it ended with (``model.path`` = that stage's ``final/``; the tokenizer stays the recipe's).
:mod:`rlzoo.recipe.compose` runs them (:func:`~rlzoo.recipe.compose.train_stages`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.plugins import PluginManager
from rlzoo.recipe.config import apply_overrides, bind_config, strip_plugin_notes
from rlzoo.recipe.types import RecipeConfig

STAGES_DIR = "stages"


def stage_dir(run_dir: Path, config: RecipeConfig, k: int) -> Path:
    """The folder of stage ``k`` (0-based): ``RUN_DIR/stages/<k+1>-<name>``."""
    return run_dir / STAGES_DIR / f"{k + 1}-{config.stages[k].name}"


def stage_config(
    config: RecipeConfig,
    k: int,
    pm: PluginManager,
    *,
    run_dir: Path | None = None,
    start_from: Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> RecipeConfig:
    """The recipe of stage ``k``: ``config`` without ``stages``, the stage's overrides applied, in its
    folder under ``run_dir`` (when given), from ``start_from``'s weights (stage > 0)."""
    stage = config.stages[k]
    raw: dict[str, Any] = strip_plugin_notes(config.to_dict())
    raw["stages"] = []
    raw["resume"] = "latest" if resume else False
    tokenizer = config.model.tokenizer_path or config.model.path
    try:
        raw = apply_overrides(raw, list(stage.overrides), pm)
        if run_dir is not None:
            raw["run"] = {
                **raw["run"],
                "output_dir": str(stage_dir(run_dir, config, k)),
                "overwrite": overwrite,
            }
        if start_from is not None:
            raw["model"] = {**raw["model"], "path": str(start_from), "tokenizer_path": tokenizer}
        cfg = bind_config(raw, pm)
    except ConfigError as exc:
        raise ConfigError(exc.problems, header=f"stages[{k}] ({stage.name!r}): invalid stage recipe") from exc
    return cfg


def check_stages(config: RecipeConfig, pm: PluginManager) -> list[str]:
    """Every stage's recipe binds (its overrides name known keys and parts; its own rules hold)."""
    problems: list[str] = []
    names = [s.name for s in config.stages]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        problems.append(f"stages: names {twice} are used more than once; each stage needs its own name")
    for k, s in enumerate(config.stages):
        if not s.name or "/" in s.name:
            problems.append(f"stages[{k}].name: {s.name!r} must be a non-empty folder name")
        try:
            stage_config(config, k, pm, start_from=Path("<previous stage>/final") if k else None)
        except ConfigError as exc:
            problems += [f"stages[{k}] ({s.name!r}): {p}" for p in exc.problems]
    return problems
