"""The runnable example of docs/composition.md."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from rlzoo.kernel.plugins import PluginManager
from rlzoo.recipe.files import list_recipes

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "compose_run.py"


def test_compose_run_example_validates(default_pm: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    if "quickstart" not in list_recipes(default_pm):
        pytest.skip("src/rlzoo/recipes/quickstart.yaml is not there yet")
    module = runpy.run_path(str(EXAMPLE))
    assert module["main"]([]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert rows["algorithm.policy_loss"] == ["policy_loss", "my_clip_loss", "<python", "object>"]


@pytest.mark.slow
def test_compose_run_example_trains_one_step(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    if "quickstart" not in list_recipes():
        pytest.skip("src/rlzoo/recipes/quickstart.yaml is not there yet")
    env = {**os.environ, "RLZOO_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--train"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'steps': 1" in proc.stdout
