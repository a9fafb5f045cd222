"""Fault injection (issue 23): kill -9 at seeded random points of checkpoint save, export, the
metrics write and resume, for every runner, on the tiny quickstart model (native backends).

Each runner's run is killed again and again (``RLZOO_KILL_AT``, :mod:`rlzoo.system.failpoints`: the
process sends itself SIGKILL at the named point) and resumed each time with the same printed
command, then once without a fault. The result must be the uninterrupted run's: every step's
metrics row exactly once (for sync with the same numbers, to the bit), the same
effective settings, ``final/`` and every ``export/step_K/`` of the right step, and the files a
user put into the run directory untouched.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import QUIET

from rlzoo.report.metrics import read_metrics

from .fault_parts import TURN2_ERROR

STEPS = 6
COMMON = [
    f"trainer.total_steps={STEPS}",
    "trainer.save_freq=2",
    "run.export_every=2",
    "trainer.test_freq=-1",
    "data.train_batch_size=4",
    "rollout.n=4",
    "trainer.ppo_mini_batch_size=4",
    "algorithm.entropy_coeff=0.01",
]
RUNNER = {
    "sync": ["runner=sync"],
    "one_step_off": ["runner=one_step_off"],
    "fully_async": [
        "~runner",
        "+runner={name:fully_async,trigger_parameter_sync_step:1,staleness_threshold:0.5,require_batches:1}",
    ],
}
#: where a step's work can be killed, with the hits (steps / saves / exports) that leave a checkpoint
#: behind to resume from; `metrics:before` only at odd steps (a kill between a checkpoint and its
#: row is `save:committed`, tested on its own below as well)
STEP_POINTS = {
    "save:staged": [2, 3],
    "save:manifest": [2, 3],
    "save:committed": [2, 3],
    "export:written": [2, 3],
    "export:installed": [2, 3],
    "metrics:before": [3, 5],
    "metrics:after": [2, 3, 4],
}
RESUME_POINTS = ["resume:loaded", "resume:branched", "resume:rewound", "resume:recorded"]
#: numbers that must equal the uninterrupted run's, step by step (sync)
EXACT_KEYS = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlzoo.cli", "train", *args]


def _run(cmd: list[str], log: Path, kill_at: str | None = None) -> int:
    env = {**os.environ, "RLZOO_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RLZOO_KILL_AT", None)
    if kill_at:
        env["RLZOO_KILL_AT"] = kill_at
    with open(log, "ab") as fh:
        fh.write(f"\n$ RLZOO_KILL_AT={kill_at} {' '.join(cmd)}\n".encode())
        fh.flush()
        return subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=300).returncode


def _tree(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def _plan(runner: str) -> list[str]:
    """The seeded kill points: the first run's, then each resume's; one of each kind (save, export,
    metrics write, resume) per runner, in a seeded order and at seeded points of that kind."""
    rng = random.Random(f"issue-23-{runner}")
    kinds = ["save", "export", "metrics"]
    rng.shuffle(kinds)
    rest = [*kinds[1:], "resume"]
    rng.shuffle(rest)
    first = rng.choice([p for p in sorted(STEP_POINTS) if p.startswith(kinds[0])])
    plan = [f"{first}@{rng.choice(STEP_POINTS[first])}"]
    for kind in rest:
        if kind == "resume":
            plan.append(f"{rng.choice(RESUME_POINTS)}@1")
        else:
            point = rng.choice([p for p in sorted(STEP_POINTS) if p.startswith(kind)])
            plan.append(f"{point}@1")
    return plan


def _effective(run_dir: Path) -> dict[str, Any]:
    """The settings a resume of ``run_dir`` would run with (what a chain of resumes composed)."""
    import rlzoo
    from rlzoo.kernel.plugins import PluginManager

    cfg = rlzoo.build_run(
        None, ["resume=latest", f"run.output_dir={run_dir}"], pm=PluginManager(load_entrypoints=False)
    ).config.to_dict()
    for key in ("resume",):
        cfg.pop(key, None)
    cfg["run"].pop("output_dir", None)
    return dict(cfg)


@pytest.mark.parametrize("runner", sorted(RUNNER))
def test_kill_9_anywhere_loses_duplicates_and_changes_nothing(
    runner: str, quickstart_dir: Path, tmp_path: Path
) -> None:
    import rlzoo
    from rlzoo.kernel.plugins import PluginManager

    args = ["quickstart", f"data.dir={quickstart_dir}", *QUIET, *COMMON, *RUNNER[runner]]
    ref, out, log = tmp_path / "ref", tmp_path / "run", tmp_path / "log.txt"
    # the run that is never killed (in this process: one interpreter start less per runner)
    pm = PluginManager(load_entrypoints=False)
    rlzoo.build_run("quickstart", [*args[1:], f"run.output_dir={ref}"], pm=pm).train()

    plan = _plan(runner)
    rc = _run(_cli(*args, f"run.output_dir={out}"), log, plan[0])
    assert rc == -9, f"{plan[0]} was not reached:\n{log.read_text()[-3000:]}"
    settings = (out / "config.yaml").read_bytes()
    # the user's own files in the run directory, added after the first crash
    (out / "notes.md").write_text("lr sweep: this one looked best")
    shutil.copytree(out / "checkpoints" / "step_2", out / "checkpoints" / "step_2_mine")
    users = {p: _tree(p) for p in (out / "checkpoints" / "step_2_mine",)}
    users[out / "notes.md"] = {"": (out / "notes.md").read_bytes()}

    resume = _cli("resume=latest", f"run.output_dir={out}")  # the printed command: no recipe, no overrides
    for kill_at in plan[1:]:
        rc = _run(resume, log, kill_at)
        assert rc in (-9, 0), log.read_text()[-3000:]
    assert _run(resume, log) == 0, log.read_text()[-3000:]

    # every step once; the same numbers as the run that was never killed
    rows, ref_rows = read_metrics(out), read_metrics(ref)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), (plan, log.read_text()[-3000:])
    # sync resumes to the bit; one-step-off regenerates the batch after the checkpoint with the
    # newer weights (by design, docs/runners.md) and fully-async's batches depend on timing
    if runner == "sync":
        for r, q in zip(rows, ref_rows):
            for k in EXACT_KEYS:
                assert r.get(k) == q.get(k), (plan, r["step"], k)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "completed" and summary["last_step"] == STEPS
    # no setting changed: config.yaml as written, and what the resumes composed equals the reference's
    assert (out / "config.yaml").read_bytes() == settings
    mine, theirs = _effective(out), _effective(ref)
    assert mine == theirs
    # the model folders hold the right steps (sync: the very weights of the run never killed)
    assert json.loads((out / "final" / "rlzoo_export.json").read_text())["step"] == STEPS
    folders = [out / "final"] + [out / "export" / f"step_{k}" for k in range(2, STEPS + 1, 2)]
    for k in range(2, STEPS + 1, 2):
        assert json.loads((out / "export" / f"step_{k}" / "rlzoo_export.json").read_text())["step"] == k
    if runner == "sync":
        from safetensors.torch import load_file

        for folder in folders:
            mine_w = load_file(folder / "model.safetensors")
            ref_w = load_file(ref / folder.relative_to(out) / "model.safetensors")
            assert mine_w.keys() == ref_w.keys()
            assert all(mine_w[n].equal(ref_w[n]) for n in mine_w), folder
    # the user's files are untouched
    for path, tree in users.items():
        assert (_tree(path) if path.is_dir() else {"": path.read_bytes()}) == tree, path


def test_kill_9_between_a_checkpoint_and_its_metrics_row(quickstart_dir: Path, tmp_path: Path) -> None:
    args = ["quickstart", f"data.dir={quickstart_dir}", *QUIET, *COMMON, *RUNNER["sync"]]
    args += ["trainer.total_steps=3", "trainer.save_freq=1"]
    out, log = tmp_path / "run", tmp_path / "log.txt"
    assert _run(_cli(*args, f"run.output_dir={out}"), log, "save:committed@2") == -9
    assert _run(_cli("resume=latest", f"run.output_dir={out}"), log) == 0, log.read_text()[-3000:]
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]


def test_a_disk_that_fills_up_mid_run_is_a_message_and_the_run_resumes(
    quickstart_dir: Path, tmp_path: Path
) -> None:
    """The disk fills up as the second checkpoint is written (``RLZOO_DISK_FULL_AT``: from there on
    the OS refuses every write that grows a file, so safetensors raises its own SafetensorError):
    one line saying what failed, where, and how to go on; a non-zero exit; the first checkpoint
    intact; the printed resume finishes the run. Before: a SafetensorError traceback."""
    from rlzoo.train.checkpoint import CheckpointManager

    args = ["quickstart", f"data.dir={quickstart_dir}", *QUIET, *COMMON, *RUNNER["sync"]]
    out = tmp_path / "run"
    env = {**os.environ, "RLZOO_DISABLE_PLUGIN_AUTOLOAD": "1", "RLZOO_DISK_FULL_AT": "save:begin@2"}
    env.pop("RLZOO_KILL_AT", None)
    cmd = _cli(*args, "trainer.total_steps=4", f"run.output_dir={out}")
    # pipes, not files: the process's own output must not hit the limit
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("rlzoo train: error:")]
    ckpts = out / "checkpoints"
    assert errors == [
        f"rlzoo train: error: could not write the checkpoint of step 4 into {ckpts}: File too large; "
        f"the previous checkpoint {ckpts / 'step_2'} is intact. Free some space (or move {out} to a "
        f"larger disk), then resume: rlzoo train resume=latest run.output_dir={out}"
    ], done.stderr[-3000:]
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step_")) == ["step_2"]
    CheckpointManager(out).verify(ckpts / "step_2")  # complete, every file as written

    log = tmp_path / "log.txt"
    assert _run(_cli("resume=latest", f"run.output_dir={out}"), log) == 0, log.read_text()[-3000:]
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4]
    assert json.loads((out / "summary.json").read_text())["ended"] == "completed"


def test_a_disk_that_fills_up_before_an_export_is_a_message_and_the_run_resumes(
    quickstart_dir: Path, tmp_path: Path
) -> None:
    """The disk fills up after step 1 (its checkpoint and row written); step 2's export is refused:
    one line naming the model folder, a non-zero exit, nothing half-written left next to it, and
    the resume redoes step 2 with its export. Before: ``cannot write .../.tmpXXXX`` (a file name
    inside the export's staging folder)."""
    args = ["quickstart", f"data.dir={quickstart_dir}", *QUIET, *COMMON, *RUNNER["sync"]]
    out = tmp_path / "run"
    env = {**os.environ, "RLZOO_DISABLE_PLUGIN_AUTOLOAD": "1", "RLZOO_DISK_FULL_AT": "metrics:after@1"}
    env.pop("RLZOO_KILL_AT", None)
    cmd = _cli(*args, "trainer.total_steps=2", "trainer.save_freq=1", f"run.output_dir={out}")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("rlzoo train: error:")]
    assert errors == [
        f"rlzoo train: error: could not write the model folder {out / 'export' / 'step_2'}: File too "
        "large; nothing was written there. Free some space, then run the command again (a run: resume "
        "it, the export is redone)"
    ], done.stderr[-3000:]
    assert not (out / "export").exists() or not list((out / "export").iterdir())

    log = tmp_path / "log.txt"
    assert _run(_cli("resume=latest", f"run.output_dir={out}"), log) == 0, log.read_text()[-3000:]
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    assert json.loads((out / "export" / "step_2" / "rlzoo_export.json").read_text())["step"] == 2
    assert json.loads((out / "final" / "rlzoo_export.json").read_text())["step"] == 2


# ---------------------------------------------------------------------------------------------
# user code that fails (issue 39): the same abort under every runner
# ---------------------------------------------------------------------------------------------
FAULT_PARTS = Path(__file__).parent / "fault_parts.py"  # the parts, and `python fault_parts.py ARGS`


@pytest.fixture(scope="module")
def tools_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """quickstart_tools's data (prepared by the first run that reads it)."""
    return tmp_path_factory.mktemp("quickstart_tools")


def _abort(args: list[str], out: Path) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    env = {**os.environ, "RLZOO_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RLZOO_KILL_AT", None)
    cmd = [sys.executable, str(FAULT_PARTS), *args, *QUIET, f"run.output_dir={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    return done, read_metrics(out)


def _failed_the_same_way(done: subprocess.CompletedProcess[str], out: Path, error: str, part: str) -> None:
    """A non-zero exit whose one error line names the streak and the error; the failure printed
    with its part; summary.json lists it by part; failures.jsonl keeps its first occurrence."""
    assert done.returncode != 0, done.stdout[-3000:]
    errors = [x for x in done.stderr.splitlines() if x.startswith("rlzoo train: error:")]
    assert len(errors) == 1 and "consecutive steps" in errors[0] and error in errors[0], done.stderr[-3000:]
    assert f"failure #1, {part}" in done.stdout, done.stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"].startswith("failed: RewardFailureError")
    assert part in summary["failures"]["by_part"]
    logged = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    assert any(e["part"] == part and error in e["message"] for e in logged)


@pytest.mark.slow
@pytest.mark.parametrize("runner", sorted(RUNNER))
def test_an_environment_raising_on_turn_2_aborts_every_runner_alike(
    runner: str, tools_dir: Path, tmp_path: Path
) -> None:
    # issue 39, finding 4: under fully_async 69-97 % of every trained batch failed, yet the share was
    # taken over everything scored since the last step (under the bar), exit 0, the summary silent
    out = tmp_path / "run"
    args = [
        "quickstart_tools",
        f"data.dir={tools_dir}",
        *COMMON,
        *RUNNER[runner],
        "trainer.total_steps=8",
        "trainer.save_freq=-1",
        "run.export_every=0",
        "rollout.environment={name:raises_on_turn_2}",
        "rollout.multi_turn={max_turns:3}",
        "reward.max_failed_frac=0.1",
        "reward.max_failed_steps=2",
    ]
    done, rows = _abort(args, out)
    _failed_the_same_way(done, out, TURN2_ERROR, "environment raises_on_turn_2")
    batch = 16  # COMMON: 4 prompts x rollout.n=4, the trained batch of every runner
    for r in rows:  # the share is of the trained batch, for every runner
        assert r["reward/failed_frac"] == pytest.approx(r["reward/failed"] / batch), r
    assert rows[-1]["reward/failed_streak"] == 2.0
    tb = next(json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines())["traceback"]
    assert "fault_parts.py" in tb and TURN2_ERROR in tb  # where it was raised, kept in the run


@pytest.mark.slow
@pytest.mark.parametrize("runner", sorted(RUNNER))
def test_a_hanging_scorer_aborts_every_runner_within_a_timeout_a_step(
    runner: str, quickstart_dir: Path, tmp_path: Path
) -> None:
    # issue 39, finding 6: a scorer hanging on every sample cost minutes a step before the abort
    out = tmp_path / "run"
    args = [
        "quickstart",
        f"data.dir={quickstart_dir}",
        *COMMON,
        *RUNNER[runner],
        "trainer.save_freq=-1",
        "run.export_every=0",
        "reward.scorer=hangs",
        "reward.manager.timeout=1",
        "reward.max_failed_steps=2",
    ]
    done, rows = _abort(args, out)
    _failed_the_same_way(done, out, "timed out after 1 s", "scorer hangs")
    assert "reward.manager.timeout=1" in done.stderr  # the limit and the setting that sets it
    assert [r["reward/failed_frac"] for r in rows] == [1.0, 1.0]
    # 16 samples, 8 threads: 2 x 1 s a step before; about one timeout now (the rest is not called)
    assert all(r["timing_s/reward"] < 2.0 for r in rows if "timing_s/reward" in r), rows


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reward", "said"),
    [
        ("nan", "step reward nan is not finite"),
        ("1e300", "is beyond +-1e+06 (rollout.multi_turn.max_abs_reward)"),
    ],
)
def test_non_finite_environment_rewards_are_counted_failures_never_null_metrics(
    reward: str, said: str, tools_dir: Path, tmp_path: Path
) -> None:
    # issue 39, finding 5: NaN / inf rewards made the reward metrics null and could zero the update,
    # exit 0; 1e300 was not even counted as a failure
    out = tmp_path / "run"
    args = [
        "quickstart_tools",
        f"data.dir={tools_dir}",
        *COMMON,
        *RUNNER["fully_async"],
        "trainer.total_steps=8",
        "trainer.save_freq=-1",
        "run.export_every=0",
        f"rollout.environment={{name:bad_reward,reward:{reward}}}",
        "reward.max_failed_frac=0.1",
        "reward.max_failed_steps=2",
    ]
    done, rows = _abort(args, out)
    _failed_the_same_way(done, out, said, "environment bad_reward")
    for r in rows:
        assert r["reward/failed/environment"] >= 1, r
        for key in ("critic/score/mean", "critic/rewards/mean", "actor/pg_loss"):
            assert isinstance(r.get(key), float) and math.isfinite(r[key]), (key, r)


@pytest.mark.slow
def test_failures_a_sample_filter_hides_from_every_batch_still_abort_fully_async(
    quickstart_dir: Path, tmp_path: Path
) -> None:
    # issue 39: with dynamic sampling every all-failed group is dropped, so no trained batch shows
    # the failures; sync skips the steps and counts what it scored, but fully_async drew prompt
    # after prompt. Now the scoring side's backstop aborts it too (RewardFailureError, as under sync)
    out = tmp_path / "run"
    args = [
        "quickstart",
        f"data.dir={quickstart_dir}",
        *COMMON,
        *RUNNER["fully_async"],
        "trainer.total_steps=8",
        "trainer.save_freq=-1",
        "run.export_every=0",
        "algorithm.sample_filter=dynamic_sampling",
        "reward.scorer=raises",
        "reward.max_failed_steps=2",
    ]
    done, _ = _abort(args, out)
    assert done.returncode != 0
    errors = [x for x in done.stderr.splitlines() if x.startswith("rlzoo train: error:")]
    assert len(errors) == 1 and "scored samples all failed" in errors[0], done.stderr[-3000:]
    assert "scorer raises: ValueError: the grader is down" in errors[0]
