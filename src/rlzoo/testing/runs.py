"""Overrides and checks for tests that run a whole recipe: simulated backends for tests of parts other
than the backends (loggers, runners, data), and :func:`kill_9_then_resume`, the crash-and-resume
accounting check of a fully-async run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: the built-in ``simulated`` rollout and train backends (``src/rlzoo/backends/simulated``): ~1 ms decode
#: steps, long-tailed response lengths up to 32 tokens, near-free training
SIMULATED_BACKENDS: tuple[str, ...] = (
    "~rollout.backend",
    "+rollout.backend={name:simulated,decode_step_s:0.001,mean_response_length:6,sigma:1.0}",
    "~trainer.backend",
    "+trainer.backend={name:simulated,update_s_per_token:2e-6,forward_s_per_token:2e-7}",
    "data.max_response_length=32",
)

#: fully_async with partial rollouts, one push per step: trajectories are in flight at every checkpoint
PARTIAL_ASYNC = (
    "runner={name:fully_async,staleness_threshold:0.5,trigger_parameter_sync_step:1,"
    "require_batches:1,partial_rollout:true}"
)


def _latest_complete(ckpts: Path) -> Path | None:
    done = [p for p in ckpts.glob("step_*") if (p / "COMPLETE").exists() and p.name[5:].isdigit()]
    return max(done, key=lambda p: int(p.name[5:])) if done else None


def _steps(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def kill_9_then_resume(
    recipe: str, tmp_path: Path, overrides: Sequence[str], *, batch: int, wait_s: float, more_steps: int = 3
) -> list[dict[str, Any]]:
    """Run ``recipe`` (fully_async, partial rollouts, ``batch`` prompts a step, a checkpoint every 2
    steps) in a process of its own, SIGKILL it once a checkpoint is written and a step more is done
    (trajectories in flight past it), resume it (its recorded config) for ``more_steps`` steps, and assert that no prompt
    was lost or trained twice: the prompts trained before the checkpoint, after the resume, and still
    outstanding at the end are disjoint and together exactly the loader's order so far. Returns the
    run's metrics rows."""
    import rlzoo
    from rlzoo.report.metrics import read_metrics

    out, log = tmp_path / "run", tmp_path / "log.txt"
    cmd = [
        sys.executable,
        "-m",
        "rlzoo.cli",
        "train",
        recipe,
        f"data.dir={tmp_path / 'data'}",
        f"run.output_dir={out}",
        "run.progress=false",
        "run.loggers=[jsonl]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.total_steps=100",
        "trainer.save_freq=2",
        f"data.train_batch_size={batch}",
        f"trainer.ppo_mini_batch_size={batch}",
        PARTIAL_ASYNC,
        *overrides,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        t0 = time.monotonic()
        try:
            while not (_latest_complete(out / "checkpoints") and _steps(out) >= 3):
                assert proc.poll() is None, f"the run exited early:\n{log.read_text()[-3000:]}"
                assert time.monotonic() - t0 < wait_s, f"timed out:\n{log.read_text()[-3000:]}"
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    ckpt = _latest_complete(out / "checkpoints")
    assert ckpt is not None
    saved: dict[str, Any] = json.loads((ckpt / "rlzoo_checkpoint.json").read_text())["payload"]
    step = int(saved["step"])
    data = saved["data"]
    outstanding = {(e, i) for e, i, *_ in data["pending"] + data["buffer"]}

    run = rlzoo.build_run(
        recipe,
        ["resume=latest", f"run.output_dir={out}", f"trainer.total_steps={step + more_steps}"],
    )
    runner: Any = run.loop()  # its batch source's prompt ledger is read below
    runner.run()
    order = runner.source.prompts.loader.order(0)
    assert data["loader"]["epoch"] == 0
    before = [(0, i) for i in order[: data["loader"]["position"]] if (0, i) not in outstanding]
    after = list(runner.source.prompts.trained_keys)
    assert len(before) == step * batch  # what the checkpoint says was trained
    assert len(after) == more_steps * batch and len(set(after)) == len(after)
    assert not set(before) & set(after)  # nothing trained twice across the crash
    st = runner.source.prompts.state_dict()
    left = [(e, i) for e, i, *_ in st["pending"] + st["buffer"]]
    assert st["loader"]["epoch"] == 0
    # nothing lost: trained before + after + still outstanding == the loader's order so far
    assert sorted(before + after + left) == sorted((0, i) for i in order[: st["loader"]["position"]])
    recs = read_metrics(out)
    assert [r["step"] for r in recs][-more_steps:] == list(range(step + 1, step + more_steps + 1))
    return recs
