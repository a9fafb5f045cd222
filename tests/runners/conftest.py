"""Fixtures of the runner tests: the quickstart data (built once, offline) and a plugin manager
with the built-in plugins (the simulated backends among them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlzoo.plugins import PluginManager

#: overrides shared by every runner test: quiet, fast, no validation before training
QUIET = ["run.progress=false", "run.loggers=[jsonl]", "trainer.val_before_train=false"]

#: simulated backends: ~1 ms decode steps, long-tailed lengths up to 32 tokens, near-free training
SIM = [
    "~rollout.backend",
    "+rollout.backend={name:simulated,decode_step_s:0.001,mean_response_length:6,sigma:1.0}",
    "~trainer.backend",
    "+trainer.backend={name:simulated,update_s_per_token:2e-6,forward_s_per_token:2e-7}",
    "data.max_response_length=32",
]


@pytest.fixture(scope="session")
def quickstart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart task's data, tokenizer and tiny model, prepared once per session."""
    from rlzoo.tasks._quickstart import prepare
    from rlzoo.tasks.quickstart import QuickstartDataParams

    out = tmp_path_factory.mktemp("quickstart")
    prepare(out, QuickstartDataParams())
    return out


@pytest.fixture(scope="session")
def pm() -> PluginManager:
    """A plugin manager with the built-ins only (the ``simulated`` backends among them)."""
    return PluginManager(load_entrypoints=False)


def overrides(quickstart_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [f"data.dir={quickstart_dir}", f"run.output_dir={run_dir}", *QUIET, *extra]


def build(
    pm: PluginManager, recipe: str, quickstart_dir: Path, run_dir: Path, *extra: str, **objects: Any
) -> Any:
    import rlzoo

    return rlzoo.build_run(recipe, overrides(quickstart_dir, run_dir, *extra), pm=pm, **objects)
