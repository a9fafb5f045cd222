"""Crash and resume of gateway episodes under fully_async (tests/agents/test_async_resume.py's check,
for ``quickstart_gateway``): a run whose agent is the shipped calc agent as a command (one process
per episode, partial rollouts across weight pushes) is killed with SIGKILL while episodes are in
flight after a checkpoint; the resumed run neither loses nor repeats an episode's prompt: the prompts
trained before the checkpoint, those trained after the resume and those still outstanding at the
end are disjoint and together exactly the loader's order so far."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import rlzoo
from rlzoo.report.metrics import read_metrics

BATCH = 4
RUNNER = (
    "runner={name:fully_async,staleness_threshold:0.5,trigger_parameter_sync_step:1,"
    "require_batches:1,partial_rollout:true}"
)


def _latest_complete(ckpts: Path) -> Path | None:
    done = [p for p in ckpts.glob("step_*") if (p / "COMPLETE").exists() and p.name[5:].isdigit()]
    return max(done, key=lambda p: int(p.name[5:])) if done else None


def _steps(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


pytest.importorskip("openai")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kill_9_mid_episodes_then_resume_loses_and_repeats_nothing(tmp_path: Path) -> None:
    out, log = tmp_path / "run", tmp_path / "log.txt"
    cmd = [
        sys.executable,
        "-m",
        "rlzoo.cli",
        "train",
        "quickstart_gateway",
        f"data.dir={tmp_path / 'data'}",
        f"run.output_dir={out}",
        "run.progress=false",
        "run.loggers=[jsonl]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.total_steps=100",
        "trainer.save_freq=2",
        f"data.train_batch_size={BATCH}",
        f"trainer.ppo_mini_batch_size={BATCH}",
        "rollout.n=2",
        RUNNER,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        t0 = time.monotonic()
        try:
            # a checkpoint, then at least one more step: trajectories are in flight past it
            while not (_latest_complete(out / "checkpoints") and _steps(out) >= 3):
                assert proc.poll() is None, f"the run exited early:\n{log.read_text()[-3000:]}"
                assert time.monotonic() - t0 < 400, f"timed out:\n{log.read_text()[-3000:]}"
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
        "quickstart_gateway", ["resume=latest", f"run.output_dir={out}", f"trainer.total_steps={step + 3}"]
    )
    runner = run.loop()
    runner.run()
    order = runner.source.prompts.loader.order(0)
    assert data["loader"]["epoch"] == 0
    before = [(0, i) for i in order[: data["loader"]["position"]] if (0, i) not in outstanding]
    after = list(runner.source.prompts.trained_keys)
    assert len(before) == step * BATCH  # what the checkpoint says was trained
    assert len(after) == 3 * BATCH and len(set(after)) == len(after)
    assert not set(before) & set(after)  # nothing trained twice across the crash
    st = runner.source.prompts.state_dict()
    left = [(e, i) for e, i, *_ in st["pending"] + st["buffer"]]
    assert st["loader"]["epoch"] == 0
    # nothing lost: trained before + after + still outstanding == the loader's order so far
    assert sorted(before + after + left) == sorted((0, i) for i in order[: st["loader"]["position"]])
    recs = read_metrics(out)
    assert [r["step"] for r in recs][-3:] == [step + 1, step + 2, step + 3]
    assert all(r["agent/gateway/calls"] > 0 for r in recs[-3:])  # the agent's episodes were trained
