"""A run directory belongs to one run, resumes compose, and rlzoo never destroys what a user has
(issue 23): a fresh run into a used directory, a misspelt or damaged one on resume, a chain of
resumes, a resume branch, a failed resume, files of the user's under ``checkpoints/``, the
best-validation checkpoint, the recipe named on a resume.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from run_fixtures import QUIET, build

from rlzoo.backends.simulated import SimulatedTrainParams
from rlzoo.backends.simulated.backend import SimulatedTrainBackend
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.plugins import PluginManager
from rlzoo.report.metrics import read_metrics
from rlzoo.testing.runs import SIMULATED_BACKENDS
from rlzoo.train.checkpoint import CheckpointError, CheckpointManager


def _steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir)]


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (the lock file's PID aside)."""
    return {
        str(f.relative_to(root)): f.read_bytes()
        for f in sorted(root.rglob("*"))
        if f.is_file() and f.name != ".rlzoo.lock"
    }


def _resume(pm: PluginManager, out: Path, *extra: str, recipe: str | None = "quickstart") -> dict:
    import rlzoo

    return rlzoo.build_run(recipe, ["resume=latest", f"run.output_dir={out}", *extra], pm=pm).train()  # type: ignore[no-any-return]


def _first(pm: PluginManager, qs: Path, out: Path, *extra: str) -> dict:
    return build(pm, "quickstart", qs, out, *SIMULATED_BACKENDS, "trainer.test_freq=-1", *extra).train()  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------
# a run directory belongs to one run
# ---------------------------------------------------------------------------------------------
def test_a_fresh_run_into_a_used_directory_is_refused_with_the_resume_command(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: config.yaml was overwritten, steps 1-2 appeared twice, the checkpoints mixed."""
    out = tmp_path / "run"
    _first(pm, quickstart_dir, out, "trainer.total_steps=2", "trainer.save_freq=1")
    before = _tree(out)
    with pytest.raises(ConfigError, match="already holds a run") as info:
        _first(pm, quickstart_dir, out, "trainer.total_steps=3")
    assert f"rlzoo train resume=latest run.output_dir={out.resolve()}" in str(info.value)
    assert "run.overwrite=true" in str(info.value)
    assert _tree(out) == before  # the refused run wrote nothing

    # run.overwrite=true moves the old run aside, whole, and starts afresh
    _first(pm, quickstart_dir, out, "trainer.total_steps=3", "run.overwrite=true")
    (aside,) = tmp_path.glob("run.replaced-*")
    assert _tree(aside) == before
    assert _steps(out) == [1, 2, 3]
    assert f"moved the previous run in {out} to {aside}" in capsys.readouterr().out


def test_a_folder_that_is_not_a_run_is_never_taken_over(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    for extra in ((), ("run.overwrite=true",)):
        with pytest.raises(
            ConfigError, match=r"not empty \(thesis.tex\) and is not an rlzoo run directory"
        ) as info:
            _first(pm, quickstart_dir, out, "trainer.total_steps=1", *extra)
        # headed by what it is (issue 39, finding 11; before: "invalid recipe: 1 problem(s)")
        assert str(info.value).startswith(f"cannot start a run in {out} (the run directory): 1 problem(s)")
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    # an empty folder is fine
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _first(pm, quickstart_dir, empty, "trainer.total_steps=1")["last_step"] == 1


def test_resume_into_a_misspelt_directory_creates_nothing(pm: PluginManager, tmp_path: Path) -> None:
    """Before: `resume=latest` created the misspelt directory, then failed with a traceback."""
    import rlzoo

    (tmp_path / "quickstart-20250101").mkdir()
    wrong = tmp_path / "quickstart-2025010"
    with pytest.raises(ConfigError, match=r"does not exist, so there is no run to resume.*Did you mean"):
        rlzoo.build_run("quickstart", ["resume=latest", f"run.output_dir={wrong}"], pm=pm)
    assert not wrong.exists()


def test_a_damaged_config_yaml_on_resume_is_named(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    """Before: a raw yaml ScannerError (or a bind error) that named no file."""
    import rlzoo

    out = tmp_path / "run"
    _first(pm, quickstart_dir, out, "trainer.total_steps=1")
    (out / "config.yaml").write_text("trainer: {total_steps: 3\n  broken: [")
    with pytest.raises(ConfigError, match=rf"{out}/config.yaml: cannot read the run's saved settings"):
        rlzoo.build_run("quickstart", ["resume=latest", f"run.output_dir={out}"], pm=pm)
    (out / "config.yaml").write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match=r"config.yaml: not a mapping of settings"):
        rlzoo.build_run("quickstart", ["resume=latest", f"run.output_dir={out}"], pm=pm)


def test_the_recipe_named_on_a_resume_is_not_silently_ignored(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    import rlzoo

    out = tmp_path / "run"
    _first(pm, quickstart_dir, out, "trainer.total_steps=2", "trainer.save_freq=1")
    with pytest.raises(ConfigError, match=r"names 'dapo_math', but .* was started from 'quickstart'"):
        rlzoo.build_run("dapo_math", ["resume=latest", f"run.output_dir={out}"], pm=pm)
    # naming none continues the saved one
    run = rlzoo.build_run(None, ["resume=latest", f"run.output_dir={out}"], pm=pm)
    assert run.config.recipe == "quickstart" and run.config.trainer.total_steps == 2


# ---------------------------------------------------------------------------------------------
# resumes compose; a failed one is not recorded; a branch is followed
# ---------------------------------------------------------------------------------------------
def test_a_chain_of_resumes_keeps_every_override(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the second resume reloaded config.yaml alone: total_steps back to 4, lr back to 1e-3,
    "unchanged", and the run stopped at once as "finished"."""
    import rlzoo

    out = tmp_path / "run"
    _first(pm, quickstart_dir, out, "trainer.total_steps=4", "trainer.save_freq=2", "trainer.optim.lr=1e-3")
    _resume(pm, out, "trainer.total_steps=6", "trainer.optim.lr=5e-4")
    capsys.readouterr()
    # as after a crash at step 5: the next resume (the printed command, no overrides) continues
    run = rlzoo.build_run(None, ["resume=4", f"run.output_dir={out}"], pm=pm)
    # it says what it replays (issue 39, finding 11; before: "from its config.yaml, unchanged")
    assert (
        f"rlzoo: resuming {out} from its config.yaml with the overrides of earlier resumes (resumes.yaml) "
        "replayed: trainer.total_steps=6 trainer.optim.lr=5e-4; no new changes"
    ) in capsys.readouterr().out
    assert run.config.trainer.total_steps == 6 and run.config.trainer.optim.lr == 5e-4
    summary = run.train()
    assert summary["start_step"] == 4 and summary["last_step"] == 6
    # and a third changes only what it names
    run = rlzoo.build_run(None, ["resume=latest", f"run.output_dir={out}", "trainer.total_steps=7"], pm=pm)
    assert "trainer.total_steps: 6 -> 7" in capsys.readouterr().out
    assert run.config.trainer.optim.lr == 5e-4
    entries = yaml.safe_load((out / "resumes.yaml").read_text())
    assert [e["from_step"] for e in entries] == [4, 4]  # the third has not happened yet
    run.train()
    assert _steps(out) == list(range(1, 8))


def test_a_failed_resume_is_not_recorded(pm: PluginManager, quickstart_dir: Path, tmp_path: Path) -> None:
    """Before: every attempt was appended to resumes.yaml, and replayed by a later resume."""
    import rlzoo

    out = tmp_path / "run"
    _first(pm, quickstart_dir, out, "trainer.total_steps=2", "trainer.save_freq=1")
    with pytest.raises(CheckpointError, match="resume=9: no checkpoint"):
        rlzoo.build_run(None, ["resume=9", f"run.output_dir={out}", "trainer.optim.lr=0.5"], pm=pm).train()
    assert not (out / "resumes.yaml").exists()
    run = rlzoo.build_run(None, ["resume=latest", f"run.output_dir={out}", "trainer.total_steps=3"], pm=pm)
    assert run.config.trainer.optim.lr != 0.5


def test_latest_follows_the_branch_a_resume_started(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    """Before: after `resume=2` and a crash, `resume=latest` loaded the abandoned branch's step_6."""
    out = tmp_path / "run"
    _first(
        pm, quickstart_dir, out, "trainer.total_steps=6", "trainer.save_freq=2", "trainer.max_checkpoints=3"
    )
    import rlzoo

    # a new branch from step 2 that stops at step 3 (as a crash after its checkpoint at 3 would)
    rlzoo.build_run(
        None, ["resume=2", f"run.output_dir={out}", "trainer.total_steps=3", "trainer.save_freq=1"], pm=pm
    ).train()
    aside = out / "checkpoints.after_step_2.1"
    assert sorted(p.name for p in aside.iterdir()) == ["step_4", "step_6"]  # kept, not deleted
    summary = _resume(pm, out, "trainer.total_steps=6", recipe=None)
    assert summary["start_step"] == 3 and summary["last_step"] == 6
    assert _steps(out) == [1, 2, 3, 4, 5, 6]
    assert yaml.safe_load((out / "resumes.yaml").read_text())[0]["moved_aside"] == [
        "checkpoints.after_step_2.1",
        "metrics.after_step_2.1.jsonl",
    ]


def _backend() -> SimulatedTrainBackend:
    return SimulatedTrainBackend(SimulatedTrainParams(checkpoint_bytes=100), None)  # type: ignore[arg-type]


def test_a_branch_move_interrupted_midway_is_completed(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=5)
    for step in (2, 4, 6):
        m.save(step, _backend(), {"step": step})
    # as if kill -9 hit after the move was decided and step_6 moved, before step_4 did
    (m.root / "branch.json").write_text(
        json.dumps({"from_step": 2, "to": "checkpoints.after_step_2.1", "steps": [4, 6]})
    )
    (tmp_path / "checkpoints.after_step_2.1").mkdir()
    (m.root / "step_6").rename(tmp_path / "checkpoints.after_step_2.1" / "step_6")
    fresh = CheckpointManager(tmp_path, keep=5)
    assert fresh.latest() == m.root / "step_2"  # never the old branch's step_4
    assert not (m.root / "branch.json").exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints.after_step_2.1").iterdir()) == ["step_4", "step_6"]


# ---------------------------------------------------------------------------------------------
# checkpoints/: the user's files, the best one
# ---------------------------------------------------------------------------------------------
def test_files_rlzoo_did_not_write_under_checkpoints_are_kept(tmp_path: Path) -> None:
    """Before: everything not named step_N (a user's `step_5_best` copy) was deleted at the next save."""
    import shutil

    m = CheckpointManager(tmp_path, keep=2)
    for step in (4, 5):
        m.save(step, _backend(), {"step": step})
    shutil.copytree(m.root / "step_5", m.root / "step_5_best")
    (m.root / "NOTES.md").write_text("step 5 was the good one")
    (m.root / "step_6.partial").mkdir()  # ours: an interrupted write
    for step in (6, 7, 8):
        m.save(step, _backend(), {"step": step})
    assert sorted(p.name for p in m.root.iterdir()) == [
        "NOTES.md",
        "latest",
        "step_5_best",
        "step_7",
        "step_8",
    ]
    assert m.latest() == m.root / "step_8"


def test_keep_best_keeps_the_best_validated_checkpoint(tmp_path: Path) -> None:
    vals = {1: 0.5, 2: 0.9, 3: 0.2, 4: None, 5: 0.1}
    for keep_best, kept in ((True, ["step_2", "step_4", "step_5"]), (False, ["step_4", "step_5"])):
        m = CheckpointManager(tmp_path / str(keep_best), keep=2, keep_best=keep_best)
        for step, val in vals.items():
            m.save(step, _backend(), {"step": step, **({"val": val} if val is not None else {})})
        assert sorted(p.name for p in m.root.iterdir() if p.name.startswith("step_")) == kept


def test_a_run_keeps_its_best_validated_checkpoint(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    build(
        pm, "quickstart", quickstart_dir, out, *SIMULATED_BACKENDS,
        "trainer.total_steps=6", "trainer.save_freq=1", "trainer.test_freq=1", "trainer.max_checkpoints=1",
    ).train()  # fmt: skip
    vals = {r["step"]: r["val/mean"] for r in read_metrics(out) if "val/mean" in r}
    best = max(vals, key=lambda k: (vals[k], -k))  # the first of equal bests
    kept = sorted(int(p.name[5:]) for p in (out / "checkpoints").glob("step_*"))
    assert kept == sorted({best, 6})


def test_the_readme_export_example_names_a_checkpoint_the_quickstart_keeps() -> None:
    """Before: `rlzoo export … --step 100`, but the quickstart keeps only steps 150 and 200."""
    import re

    from rlzoo.recipe.config import load_config

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    steps = [int(s) for s in re.findall(r"rlzoo export runs/quickstart-\S+ --step (\d+)", readme)]
    assert steps
    t = load_config("quickstart", QUIET).trainer
    assert t.total_steps is not None and t.save_freq > 0
    saved = list(range(t.save_freq, t.total_steps + 1, t.save_freq))
    for step in steps:
        assert step in saved[-t.max_checkpoints :], (step, saved[-t.max_checkpoints :])


def test_a_users_file_in_final_stops_the_run_before_training(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    """final/ is replaced only when it holds nothing but an earlier export: said at the start."""
    from rlzoo.kernel.errors import RlzooError

    out = tmp_path / "run"
    _first(pm, quickstart_dir, out, "trainer.total_steps=1")
    (out / "final").mkdir()
    (out / "final" / "eval.txt").write_text("0.42")
    with pytest.raises(
        RlzooError, match=r"final already holds files rlzoo did not export there \(eval.txt\)"
    ):
        _resume(pm, out, "trainer.total_steps=2", recipe=None)
    assert _steps(out) == [1] and (out / "final" / "eval.txt").read_text() == "0.42"


def test_resuming_a_finished_run_says_so_and_keeps_its_summary(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39, finding 10. Before: the printed resume command on a finished run trained nothing and
    rewrote summary.json with nulls (first_reward, last_reward, final: {})."""
    out = tmp_path / "run"
    _first(pm, quickstart_dir, out, "trainer.total_steps=2")
    before = (out / "summary.json").read_bytes()
    assert json.loads(before)["first_reward"] is not None
    capsys.readouterr()
    summary = _resume(pm, out)
    assert f"rlzoo: {out.resolve()} is finished: its checkpoint of step 2 is the run's last step" in (
        capsys.readouterr().out
    )
    assert (out / "summary.json").read_bytes() == before
    assert summary == json.loads(before)
    assert _steps(out) == [1, 2]


def test_environment_variables_stay_out_of_the_run_directory(
    pm: PluginManager, quickstart_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39, finding 10: a setting that reads ``${oc.env:VAR}`` is saved as written, not as the
    variable's value, and a resume resolves it again from its own environment. Before: config.yaml
    (and what a resume printed and recorded) held the value."""
    monkeypatch.setenv("RLZOO_TEST_SECRET", "s3cr3t-t0ken")
    out = tmp_path / "run"
    _first(pm, quickstart_dir, out, "trainer.total_steps=1", "run.name=${oc.env:RLZOO_TEST_SECRET}-x")
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["run"]["name"] == "${oc.env:RLZOO_TEST_SECRET}-x"
    for f in out.rglob("*"):
        if f.is_file() and f.suffix in (".yaml", ".json", ".jsonl", ".txt"):
            assert "s3cr3t" not in f.read_text(errors="replace"), f
    import rlzoo

    monkeypatch.setenv("RLZOO_TEST_SECRET", "other")
    run = rlzoo.build_run(None, ["resume=latest", f"run.output_dir={out}"], pm=pm)
    assert run.config.run.name == "other-x"  # resolved now, from this environment


def test_a_run_killed_after_its_last_checkpoint_is_summed_up_by_its_resume(
    quickstart_dir: Path, tmp_path: Path
) -> None:
    """The other side of a finished run: kill -9 after the last step's checkpoint, before its row and
    its summary. The resume has no step to train, writes the row from the checkpoint and a summary
    of the run's rows ("completed", rewards filled in), not the nulls of a run of no steps."""
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    args = [f"data.dir={quickstart_dir}", *QUIET, *SIMULATED_BACKENDS, "trainer.test_freq=-1"]
    cmd = [sys.executable, "-m", "rlzoo.cli", "train", "quickstart", *args]
    env = {**os.environ, "RLZOO_DISABLE_PLUGIN_AUTOLOAD": "1", "RLZOO_KILL_AT": "metrics:before@2"}
    steps = ["trainer.total_steps=2", "trainer.save_freq=1", f"run.output_dir={out}"]
    assert subprocess.run([*cmd, *steps], env=env, capture_output=True, timeout=300).returncode == -9
    assert not (out / "summary.json").exists()
    env.pop("RLZOO_KILL_AT")
    resume = [sys.executable, "-m", "rlzoo.cli", "train", "resume=latest", f"run.output_dir={out}"]
    done = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "is finished" not in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "completed" and summary["last_step"] == 2
    assert summary["first_reward"] is not None and summary["final"]["step"] == 2
    assert _steps(out) == [1, 2]
