"""Staged recipes (sft -> grpo): one run directory, one metrics.jsonl with a stage field, the second
stage from the first's weights; killed (-9) in the middle of each stage and resumed, the run equals
an uninterrupted one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlzoo.report.metrics import read_metrics

SCRIPT = Path(__file__).with_name("_stages_run.py")
#: what a run measures of itself, not what it computed
_CLOCK = ("time", "timing_s/", "perf/", "trainer/step_wall_s", "trainer/idle_ratio", "weight_sync/")


def run(data: Path, out: Path, *, resume: bool = False, kill_at: str | None = None) -> int:
    env = dict(os.environ)
    env.pop("RLZOO_KILL_AT", None)
    if kill_at:
        env["RLZOO_KILL_AT"] = kill_at
    cmd = [sys.executable, str(SCRIPT), str(data), str(out), *(["resume"] if resume else [])]
    return subprocess.run(cmd, env=env, timeout=900, capture_output=True, text=True).returncode


def numbers(run_dir: Path) -> list[dict]:
    rows = read_metrics(run_dir)
    return [{k: v for k, v in r.items() if not k.startswith(_CLOCK) and "time_s" not in k} for r in rows]


@pytest.mark.slow
def test_staged_run_killed_in_each_stage_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    data = tmp_path / "data"
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert run(data, whole) == 0
    rows = numbers(whole)
    # one metrics file: sft steps 1-4 then grpo steps 1-4 as steps 5-8 (each stage validates first)
    assert [(r["stage"], r["stage_step"], r["step"]) for r in rows] == [
        *[("sft", k, k) for k in range(5)],
        *[("grpo", k, 4 + k) for k in range(5)],
    ]
    assert all(r["actor/pg_loss"] > 0 for r in rows if r["stage"] == "sft" and r["stage_step"] > 0)
    summary = json.loads((whole / "summary.json").read_text())
    assert [s["ended"] for s in summary["stages"]] == ["completed", "completed"]
    grpo_cfg = (whole / "stages" / "2-grpo" / "config.yaml").read_text()
    assert str(whole / "stages" / "1-sft" / "final") in grpo_cfg  # stage 2 from stage 1's weights
    assert (whole / "final" / "config.json").is_file()
    # killed after sft step 3's row (checkpoint at 2), resumed; that process killed after grpo step 3's
    # row (its 5th row: sft 3, 4, grpo 1, 2, 3), resumed again
    assert run(data, killed, kill_at="metrics:after@3") == -9
    assert run(data, killed, resume=True, kill_at="metrics:after@5") == -9
    assert run(data, killed, resume=True) == 0
    got = numbers(killed)
    assert [(r["stage"], r["stage_step"]) for r in got] == [(r["stage"], r["stage_step"]) for r in rows]
    off = []
    for a, b in zip(got, rows):
        assert a.keys() == b.keys()
        for k in a:
            same = (
                a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-6)  # float32 noise of the drift metrics
                if isinstance(a[k], float) and isinstance(b[k], float)
                else a[k] == b[k]
            )
            if not same:
                off.append((a["stage"], a["stage_step"], k, a[k], b[k]))
    assert not off, off


def test_every_stage_is_checked_before_anything_runs(tmp_path: Path) -> None:
    import rlzoo
    from rlzoo.kernel.errors import ConfigError
    from rlzoo.recipe.config import load_config

    cfg = load_config("quickstart_tools_sft", [f"data.dir={tmp_path}", f"run.output_dir={tmp_path / 'run'}"])
    cfg.stages[0].overrides = [*cfg.stages[0].overrides, "trainer.no_such_key=1", "rollout.n=8"]
    cfg.stages[1].name = cfg.stages[0].name
    with pytest.raises(ConfigError) as err:
        rlzoo.build_run(cfg)
    text = str(err.value)
    assert "stages[0] ('sft'): trainer.no_such_key" in text
    assert "stages[0] ('sft'): rollout.n: 8" in text  # the sft runner's own rule, in that stage
    assert "names ['sft'] are used more than once" in text
    assert not (tmp_path / "run").exists()  # nothing written


def test_a_stage_override_the_grammar_cannot_read_is_refused_not_merged(tmp_path: Path) -> None:
    # an unquoted ~/ path made the line unreadable to the override grammar, and it was merged as plain
    # keys: the runner switched to sft without the switch's rules (sync's on_policy_fraction kept)
    import rlzoo
    from rlzoo.kernel.errors import ConfigError
    from rlzoo.recipe.config import apply_overrides, load_config, strip_plugin_notes

    line = "runner={name: sft, files: [~/demos.parquet], generate: 32}"
    with pytest.raises(ConfigError) as err:
        apply_overrides(strip_plugin_notes(load_config("quickstart").to_dict()), [line])
    (problem,) = err.value.problems
    assert problem.startswith(f"override {line!r}: the override grammar cannot read it")
    assert "in quotes" in problem

    cfg = load_config("quickstart_tools_sft", [f"data.dir={tmp_path}", f"run.output_dir={tmp_path / 'run'}"])
    cfg.stages[0].overrides = [*cfg.stages[0].overrides, line]
    with pytest.raises(ConfigError) as err:
        rlzoo.build_run(cfg)
    assert f"stages[0] ('sft'): override {line!r}" in str(err.value)
    assert not (tmp_path / "run").exists()  # nothing written
    # the same value quoted is read
    quoted = "runner={name: sft, files: ['~/demos.parquet'], generate: 32}"
    out = apply_overrides(strip_plugin_notes(load_config("quickstart").to_dict()), [quoted])
    assert out["runner"]["files"] == ["~/demos.parquet"]
