"""SIGTERM (what SLURM, Kubernetes and ``docker stop`` send) stops a run as Ctrl-C does (issue 39,
finding 8): the resume command printed, ``summary.json`` saying how the run ended, exit status 143;
the printed command then finishes the run with every step's row exactly once. Before: the process
died as under kill -9, silently, with no summary."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_fixtures import QUIET

from rlzoo.report.metrics import read_metrics
from rlzoo.system.signals import EXIT_TERMINATED

STEPS = 8


def _rows(run_dir: Path) -> int:
    try:
        return len((run_dir / "metrics.jsonl").read_text().splitlines())
    except FileNotFoundError:
        return 0


@pytest.mark.slow  # two quickstart runs in subprocesses: ~50 s on 2 shared cores
def test_sigterm_mid_run_prints_the_resume_command_and_the_run_resumes(
    quickstart_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "RLZOO_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RLZOO_KILL_AT", None)
    args = [f"data.dir={quickstart_dir}", *QUIET, f"trainer.total_steps={STEPS}", "trainer.save_freq=2"]
    cmd = [sys.executable, "-m", "rlzoo.cli", "train", "quickstart", *args, f"run.output_dir={out}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while _rows(out) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be sent SIGTERM"
        proc.send_signal(signal.SIGTERM)  # mid-run: step 3's row is written, step 4 is under way
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_TERMINATED == 143, stderr[-3000:]
    assert "rlzoo train: terminated (SIGTERM)" in stderr
    assert "Traceback" not in stderr, stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["ended"] == "interrupted (SIGTERM)"
    lines = stdout.splitlines()
    hint = lines.index(next(line for line in lines if line.endswith("Resume with:")))
    assert "the last checkpoint is" in lines[hint] and str(out / "checkpoints" / "step_") in lines[hint]
    resume = shlex.split(lines[hint + 1].strip())
    assert resume[:2] == ["rlzoo", "train"] and f"run.output_dir={out}" in resume

    done = subprocess.run(
        [sys.executable, "-m", "rlzoo.cli", *resume[1:]], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out)] == list(range(1, STEPS + 1))
    assert json.loads((out / "summary.json").read_text())["ended"] == "completed"
